"""The ground floor: errors and exit codes, atomic files, child processes, provenance, secret scrubbing, library noise."""
