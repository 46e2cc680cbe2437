"""The end of a run: what it says (stopped and how to resume, its summary, a finished run's state) and the
final policy exported as a Hugging Face folder."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_llm.parallel import hosts
from jaxrl_llm.train.export import export_adapter, export_policy
from jaxrl_llm.train.stop import RESUME_EXIT_CODE
from jaxrl_llm.train.tracking import summary
from jaxrl_llm.utils.atomic import atomic_folder


def export_final(run, final: Path) -> None:
    """The policy as a Hugging Face folder (a LoRA run's adapter merged, and the adapter alone in PEFT's format
    in `<final>_adapter`), written by process 0 (every process takes part in gathering parameters sharded over
    hosts). Each folder is written whole and renamed into place (utils/atomic.py): a kill mid-export leaves the
    previous export or none, never a part that a rerun would take for complete."""
    params = run.state.params
    if hosts.count() > 1:
        params = jax.tree.map(lambda x: jnp.asarray(hosts.to_host(x)), params)
    if jax.process_index() == 0:
        model = nnx.merge(run.policy.graphdef, params)
        if run.policy.adapters:  # first: `final/` (what a rerun checks) appears only after both are whole
            adapter = final.with_name(final.name + "_adapter")
            with atomic_folder(adapter) as folder:
                export_adapter(model, folder, run.cfg.model.name)
        with atomic_folder(final) as folder:
            export_policy(model, folder, run.tok)
        run.log(f"exported the final policy to {final}")
        if run.policy.adapters:
            run.log(f"exported its LoRA adapter (PEFT's format) to {adapter}")


def close(run, writer) -> None:
    run.ckpt.close()
    run.sft_ckpt.close()
    if writer is not None:
        writer.close()


def finish(run, writer, stop, saved: str) -> None:
    """Close what the run opened; say how it ended; export the final policy of a run that was not stopped."""
    close(run, writer)
    run.stopped = stop.agreed
    if stop.agreed:
        run.log(f"stopped by {stop.describe()}; saved {saved}; run the same command again to resume "
                f"(exit status {RESUME_EXIT_CODE})")
        return
    if jax.process_index() == 0 and (run.out_dir / "metrics.jsonl").exists():
        run.log(summary(run.out_dir))
    if run.cfg.train.export_final:
        export_final(run, run.out_dir / "final")


def already_complete(run) -> dict:
    """A resumed run with every RL step done: say so, export the final policy if it is missing."""
    close(run, None)
    final = run.out_dir / "final"
    run.log(f"{run.out_dir} is complete: {run.state.step} of train.steps={run.cfg.train.steps} RL steps done"
            + (f"; final policy in {final}" if (final / "config.json").is_file() else "")
            + "; raise train.steps to continue it, or use another train.out_dir")
    if run.cfg.train.export_final and not (final / "config.json").is_file():
        export_final(run, final)
    return {}
