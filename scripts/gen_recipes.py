"""Write conf/recipe/<name>.yaml, one option per Bridge perf recipe in scope, from the installed library.

    PYTHONPATH=$PWD .venv/bin/python scripts/gen_recipes.py          # (re)write every option
    PYTHONPATH=$PWD .venv/bin/python scripts/gen_recipes.py --check  # exit 1 when an option drifted

Each recipe function is called (offline), its ConfigContainer read back into our knobs through THE
table (moe_vlm/engines/megatron/vendor_recipes.py), and the option checked: with those knobs the
engine's config, after Bridge's runtime update, equals the function's own but for the documented
deliberate differences. Needs the Megatron stack (about 1 s per recipe after the import).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from pathlib import Path

from moe_vlm.engines.megatron.stack import versions
from moe_vlm.engines.megatron.vendor_recipes import Derived, derive, library_recipes
from moe_vlm.knobs.recipes import RECIPE_DIR, option_text


def render(derived: Derived) -> str:
    return option_text(
        derived.recipe.name,
        derived.recipe.module,
        derived.groups,
        derived.values,
        derived.differences,
        versions()["megatron-bridge"] or "?",
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with conf/recipe/ instead of writing")
    parser.add_argument("names", nargs="*", help="only these recipes (default: every one in scope)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    drifted: list[str] = []
    recipes = library_recipes()
    chosen = [r for r in recipes if not args.names or r.name in args.names]
    with tempfile.TemporaryDirectory() as workdir:
        for recipe in chosen:
            text = render(derive(recipe, Path(workdir)))
            path = RECIPE_DIR / f"{recipe.name}.yaml"
            if args.check:
                if not path.exists() or path.read_text() != text:
                    drifted.append(recipe.name)
            else:
                path.write_text(text)
            print(f"{'checked' if args.check else 'wrote'} {path.name}", flush=True)
    names = {r.name for r in recipes}
    stale = [] if args.names else sorted(p.stem for p in RECIPE_DIR.glob("*.yaml") if p.stem not in names)
    if args.check and (drifted or stale):
        print(f"drifted: {drifted}; options without a library function: {stale}", file=sys.stderr)
        return 1
    for name in stale if not args.check else ():
        (RECIPE_DIR / f"{name}.yaml").unlink()
        print(f"removed {name}.yaml (no such function in this library)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
