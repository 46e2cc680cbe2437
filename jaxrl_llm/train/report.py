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


def export_final(run, final: Path) -> None:
    """The policy as a Hugging Face folder (a LoRA run's adapter merged, and the adapter alone in PEFT's format
    in `<final>_adapter`), written by process 0 (every process takes part in gathering parameters sharded over
    hosts)."""
    params = run.state.params
    if hosts.count() > 1:
        params = jax.tree.map(lambda x: jnp.asarray(hosts.to_host(x)), params)
    if jax.process_index() == 0:
        model = nnx.merge(run.policy.graphdef, params)
        export_policy(model, final, run.tok)
        run.log(f"exported the final policy to {final}")
        if run.policy.adapters:
            adapter = export_adapter(model, final.with_name(final.name + "_adapter"), run.cfg.model.name)
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
