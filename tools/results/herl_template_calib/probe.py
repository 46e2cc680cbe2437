"""Scratch probe (issue 25, HeRL control calibration): one model load, many (hidden item x revise template) variants.

Per batch: `prompts` training questions (visible constraint only) x `group` fresh samples at the rollout T;
each variant's rubric scores the same fresh texts (the question never names the hidden item, so the fresh
samples are shared); HeRL's own failed_groups/candidates pick up to `limit` candidates; each template's revise
prompts are sampled at the guided T and scored against the variant's rubric; success = revision strictly above
its group's best (herl_revision_success).
    cd /work/frozen && nice -n 19 /work/main/.venv/bin/python tools/results/herl_template_calib/probe.py SPEC.py OUT.json
SPEC.py defines VARIANTS {name: hidden item dict}, TEMPLATES {name: template}, and optional SETTINGS.
"""
import json, runpy, sys, time
from pathlib import Path

import jax, jax.numpy as jnp
import numpy as np

sys.path.insert(0, ".")
from jaxrl_llm.config import load_config
from jaxrl_llm.data.rubric_tasks import BASE_INSTRUCTIONS
from jaxrl_llm.explore.herl import candidates, failed_groups, revise_text
from jaxrl_llm.model.tokenizer import pad_id, stop_ids
from jaxrl_llm.parallel.mesh import make_mesh
from jaxrl_llm.rewards.rubrics import prepare_checks, score_rubric
from jaxrl_llm.rl.forward import cast_floats
from jaxrl_llm.sampling.buckets import bucket
from jaxrl_llm.sampling.sampler import Sampler
from jaxrl_llm.train.policy import encode_text
from jaxrl_llm.train.restore import load_checkpoint
from jaxrl_llm.train.rollout import response_texts

spec = runpy.run_path(sys.argv[1])
out_path = Path(sys.argv[2])
S = {"batches": 2, "prompts": 4, "group": 8, "rollout_t": 0.7, "guided_t": 0.3, "limit": 16, "limits": (60, 70, 80, 90, 100, 110, 120, 150),
     "seed": 0, "max_new": 96, "show": 3, "visible": "Use fewer than {n} words.", "num_guided": 1}
S.update(spec.get("SETTINGS", {}))
VARIANTS, TEMPLATES = spec["VARIANTS"], spec["TEMPLATES"]
INVITING = ("lighthouse", "clockmaker")
base = [t for t in BASE_INSTRUCTIONS if not any(w in t.lower() for w in INVITING)][:30]

cfg = load_config("configs/rubric_smollm2.yaml", ["train.out_dir=/tmp/herl_probe_empty", "train.tensorboard=false"])
mesh = make_mesh({"data": cfg.mesh.data, "fsdp": cfg.mesh.fsdp, "tensor": cfg.mesh.tensor})
loaded = load_checkpoint(cfg, mesh, None, print)
policy, tok = loaded.policy, loaded.policy.tokenizer
mc = policy.model_cfg
sampler = Sampler(policy.graphdef, pad_id=pad_id(tok), stop_ids=stop_ids(tok, mc.eos_token_ids),
                  max_cache_len=mc.max_position_embeddings, mesh=mesh, share_prefill=cfg.rollout.shared_prefix)
params = jax.jit(lambda p: cast_floats(p, jnp.dtype(cfg.model.compute_dtype)))(loaded.params)
prepare_checks()
visible = lambda n: {"description": S["visible"].format(n=n), "weight": 1, "check": "ifeval:length_constraints:number_words",
                     "args": {"num_words": n, "relation": "less than"}}
rng = np.random.default_rng(S["seed"])
key = jax.random.key(S["seed"])
enc = lambda text: encode_text(tok, cfg, text)
# one context floor for every revise call: the longest template with a long question and a full draft
ctx_floor = bucket(max(len(enc(revise_text(t, base[0] + " " + S["visible"].format(n=150), [], [v["description"] for v in VARIANTS.values()] * 2, "")))
                       for t in TEMPLATES.values()) + S["max_new"], 16)
rows_call = S["prompts"] * S["group"]
tally = {}
t0 = time.time()
for b in range(S["batches"]):
    qs = [(base[int(rng.integers(len(base)))], int(S["limits"][int(rng.integers(len(S["limits"])))])) for _ in range(S["prompts"])]
    questions = [f"{t} {S['visible'].format(n=n)}" for t, n in qs]
    prompts = [enc(q) for q in questions for _ in range(S["group"])]
    out = sampler(params, prompts, max_new_tokens=S["max_new"], temperature=S["rollout_t"], key=jax.random.fold_in(key, 2 * b))
    texts = response_texts(tok, out)
    group = np.repeat(np.arange(S["prompts"]), S["group"])
    jobs = []  # (variant, template, cand row, group best)
    for vname, hidden in VARIANTS.items():
        rubrics = [json.dumps([visible(n), hidden]) for _, n in qs]
        sc = [score_rubric(rubrics[group[i]], texts[i]) for i in range(len(texts))]
        scored = np.array([s for s, _ in sc]); met = np.array([m for _, m in sc], bool)
        t = tally.setdefault(vname, {"fresh": 0, "fresh_hidden": 0, "fresh_visible": 0})
        t["fresh"] += len(texts); t["fresh_hidden"] += int(met[:, 1].sum()); t["fresh_visible"] += int(met[:, 0].sum())
        failed = failed_groups(group, scored, np.ones(len(texts), bool), 1.0)
        cands = candidates(failed, scored, met.sum(1), S["limit"])
        for tname, tmpl in TEMPLATES.items():
            for f, r in cands:
                for _ in range(S["num_guided"]):
                    desc = [visible(qs[group[r]][1])["description"], hidden["description"]]
                    ctx = revise_text(tmpl, questions[group[r]], [d for d, m in zip(desc, met[r]) if m], [d for d, m in zip(desc, met[r]) if not m], texts[r])
                    jobs.append((vname, tname, r, failed[f][2], rubrics[group[r]], ctx))
    rev_texts = []
    for c, s in enumerate(range(0, len(jobs), rows_call)):
        part = jobs[s:s + rows_call]
        o = sampler(params, [enc(j[5]) for j in part], max_new_tokens=S["max_new"], temperature=S["guided_t"],
                    key=jax.random.fold_in(jax.random.fold_in(key, 2 * b + 1), c), min_rows=rows_call, min_context=ctx_floor)
        rev_texts += response_texts(tok, o)
    shown = {}
    for (vname, tname, r, best, rubric, ctx), rt in zip(jobs, rev_texts):
        s, m = score_rubric(rubric, rt)
        t = tally.setdefault(f"{vname}|{tname}", {"rev": 0, "success": 0, "hidden": 0, "visible": 0})
        t["rev"] += 1; t["success"] += int(s > best + 1e-6); t["hidden"] += int(m[1]); t["visible"] += int(m[0])
        if shown.get((vname, tname), 0) < S["show"]:
            shown[(vname, tname)] = shown.get((vname, tname), 0) + 1
            print(f"--- {vname}|{tname} best={best} score={s} met={m}\n  DRAFT: {texts[r]!r}\n  REV:   {rt!r}")
    print(f"batch {b} done, {time.time() - t0:.0f}s", flush=True)
    for k, v in tally.items():
        print(k, v, {kk: round(v[kk] / v['rev'], 3) for kk in ('success', 'hidden', 'visible')} if 'rev' in v else
              {kk: round(v[kk] / v['fresh'], 3) for kk in ('fresh_hidden', 'fresh_visible')}, flush=True)
out_path.write_text(json.dumps({"settings": {k: v for k, v in S.items()}, "variants": VARIANTS, "templates": TEMPLATES,
                                "tally": tally, "time_s": time.time() - t0}, indent=1) + "\n")
