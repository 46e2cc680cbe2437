"""LLM judge for rubric items whose check is "judge": one prompt per (question, response, items) request, the
verdict a JSON list of 0/1, one per item.

The judge is any text generator `generate(prompts) -> texts`; `sampler_generate` makes one from our own jitted
Sampler (greedy), so a local model judges without another serving stack. All requests go out as one batch;
only the requests whose answer did not parse are asked again, and a request still unparsed after the retries
scores 0 on its items and is counted in `parse_failures` (a judge that cannot answer must not grant reward).
"""

from __future__ import annotations

import re
from typing import Callable, Sequence

from jaxrl_llm.model.tokenizer import encode_chat
from jaxrl_llm.rewards.rubrics import JUDGE, RubricItem

Generate = Callable[[list[str]], list[str]]
JudgeRequest = tuple[str, str, Sequence[RubricItem]]  # (question, response, the items to judge)

_VERDICT = re.compile(r"\[\s*(?:(?:0|1|true|false)\s*,\s*)*(?:0|1|true|false)\s*\]", re.IGNORECASE)


def judge_prompt(question: str, response: str, items: Sequence[RubricItem]) -> str:
    criteria = "\n".join(f"{k + 1}. {it.description}" for k, it in enumerate(items))
    return (f"You are grading a response against a rubric. For each numbered criterion, decide whether the "
            f"response meets it.\n\n### Question\n{question}\n\n### Response\n{response}\n\n### Criteria\n{criteria}"
            f"\n\nAnswer with a JSON list of {len(items)} values in the order of the criteria, 1 if the response "
            f"meets the criterion and 0 if it does not, and nothing else.")


def parse_verdict(text: str, n: int) -> list[int] | None:
    """The first list of n values 0/1/true/false anywhere in `text` (prose and code fences around it are fine),
    or None when there is none."""
    for match in _VERDICT.finditer(text):
        values = [v.strip().lower() for v in match.group(0)[1:-1].split(",")]
        if len(values) == n:
            return [int(v in ("1", "true")) for v in values]
    return None


def judge_items(items: Sequence[RubricItem]) -> list[RubricItem]:
    """The items a judge decides, in rubric order."""
    return [it for it in items if it.check == JUDGE]


def aligned(items: Sequence[RubricItem], verdict: Sequence[int]) -> list[int | None]:
    """A verdict on `judge_items(items)` spread over the whole rubric, None at the other items: `grade`'s judged."""
    slots = [k for k, it in enumerate(items) if it.check == JUDGE]
    if len(verdict) != len(slots):
        raise ValueError(f"{len(verdict)} verdicts for {len(slots)} judge items")
    out: list[int | None] = [None] * len(items)
    for k, value in zip(slots, verdict):
        out[k] = int(value)
    return out


class Judge:
    def __init__(self, generate: Generate, max_retries: int = 1):
        self.generate = generate
        self.max_retries = max_retries
        self.parse_failures = 0

    def __call__(self, requests: Sequence[JudgeRequest]) -> list[list[int]]:
        """A 0/1 list per request, one value per item it names."""
        sizes = [len(items) for _, _, items in requests]
        prompts = [judge_prompt(*r) for r in requests]
        verdicts: list[list[int] | None] = [None] * len(requests)
        pending = [i for i, n in enumerate(sizes) if n > 0]
        for _ in range(1 + self.max_retries):
            if not pending:
                break
            texts = self.generate([prompts[i] for i in pending])
            if len(texts) != len(pending):
                raise ValueError(f"the judge's generate returned {len(texts)} texts for {len(pending)} prompts")
            for i, text in zip(pending, texts):
                verdicts[i] = parse_verdict(text, sizes[i])
            pending = [i for i in pending if verdicts[i] is None]
        self.parse_failures += len(pending)
        return [v if v is not None else [0] * n for v, n in zip(verdicts, sizes)]


def sampler_generate(sampler, params, tokenizer, max_new_tokens: int, chat_template: bool = True,
                     min_rows: int = 0) -> Generate:
    """`generate` from our Sampler: greedy (temperature 0), each prompt as one user turn through the tokenizer's
    chat template when it has one (and `chat_template`), the generated tokens decoded without special tokens.
    `min_rows`: the sampler's batch floor, so calls of varying sizes share a program."""
    use_template = chat_template and bool(getattr(tokenizer, "chat_template", None))

    def encode(prompt: str) -> list[int]:
        if use_template:
            return encode_chat(tokenizer, [{"role": "user", "content": prompt}])
        return tokenizer(prompt, add_special_tokens=False)["input_ids"]

    def generate(prompts: list[str]) -> list[str]:
        out = sampler(params, [encode(p) for p in prompts], max_new_tokens=max_new_tokens, temperature=0.0,
                      min_rows=min_rows)
        return [tokenizer.decode(out.generated(i), skip_special_tokens=True) for i in range(out.rows)]

    return generate


def load_judge(name_or_folder: str, max_new_tokens: int, mesh=None, min_rows: int = 0) -> Generate:
    """`generate` from a local model other than the policy: an HF folder (or a known short name, prepared
    locally), loaded once with its tokenizer, its weights fixed, run greedily through our own Sampler."""
    from jaxrl_llm.model.hf_io import load_hf_folder
    from jaxrl_llm.model.registry import resolve
    from jaxrl_llm.model.tokenizer import load_tokenizer, pad_id, stop_ids
    from jaxrl_llm.sampling.sampler import Sampler

    folder = resolve(name_or_folder)
    model, model_cfg = load_hf_folder(folder, mesh=mesh)
    tok = load_tokenizer(folder)
    sampler, state = Sampler.for_model(model, pad_id=pad_id(tok), stop_ids=stop_ids(tok, model_cfg.eos_token_ids),
                                       mesh=mesh)
    return sampler_generate(sampler, state, tok, max_new_tokens, min_rows=min_rows)
