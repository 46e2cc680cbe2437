"""`python tools/controls.py SPEC [--out FILE]` is `jaxrl-llm ablate-check` (jaxrl_llm/ablate/controls.py)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a frozen copy of the tree runs its own code
from jaxrl_llm.ablate.command import check_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(check_main())
