"""What a run may ask for: the schema, its composition and pre-flight, and the RunSpec with every derived number."""
