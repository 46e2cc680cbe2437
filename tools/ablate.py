"""`python tools/ablate.py SPEC ...` is `jaxrl-llm ablate SPEC ...` (jaxrl_llm/ablate/), with this tree's package."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a frozen copy of the tree runs its own code
from jaxrl_llm.ablate.command import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
