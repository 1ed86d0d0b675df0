"""What an engine environment holds, per sglang release: every package pinned to one version.

The list is the environment a real sglang engine host runs, reduced to what sglang imports on
this CPU path (measured: ``shared/reference/real-sglang-on-cpu.md``). It is a full lock: each
package is installed with ``--no-deps``, so what pip resolves never drifts between builds, and
the hash of the list is part of the environment's cache key.

Left out on purpose (CUDA-only or unused on the CPU path): flashinfer, flash-attn,
sgl-kernel/sglang-kernel (PyPI's builds are CUDA-only), deep-gemm, cuda-python, nvidia-*, torchao,
torchaudio, outlines, llguidance, openai-harmony (without it ``/v1/responses`` is off).
"""

from __future__ import annotations

import hashlib
import json

from forensics.engine import kernel_standin
from forensics.exitcodes import UsageProblem

# ``pip install torch==2.13.0`` takes the CPU build that lies on these machines' disk; any other torch
# spec pulls a multi-GB CUDA build. sglang 0.5.13-0.5.15.post1 pin torch 2.11.0 and run on 2.13.0.
TORCH = "torch==2.13.0"

# sglang's own imports that its wheel does not bring on a CPU (installed --no-deps, as measured):
# triton is imported at utils/common.py:87 (imports fine without a GPU), torchvision for
# ``from torchvision.io import decode_jpeg`` (utils/common.py:94), xgrammar by the scheduler, NIXL
# for the KV transfer, sglang-router for the mini load balancer.
ENGINE_EXTRAS = (
    "torchvision==0.28.0",
    "triton==3.7.1",
    "xgrammar==0.2.1",
    "apache-tvm-ffi==0.1.11",
    "nixl==1.5.1",
    "nixl-cu12==1.5.1",
    "sglang-router==0.3.2",
)

# The imported dependencies and theirs, as pip resolved them for 0.5.15's measured list, but for
# fastapi: 0.137.0 began to put an included router in ``app.routes`` as an ``_IncludedRouter`` with
# no ``path``, and sglang 0.5.13-0.5.16's metrics middleware reads ``route.path`` of each route
# (``_get_fastapi_request_path``, utils/common.py:2385 in 0.5.15), so with the newest fastapi every
# included route, ``/v1/loads`` among them, answers 500. 0.136.3 is the last release before that.
DEPENDENCIES = (
    "aiohappyeyeballs==2.7.1", "aiohttp==3.14.5", "aiosignal==1.4.0", "annotated-doc==0.0.7",
    "annotated-types==0.8.0", "anthropic==2.15.0", "anyio==4.16.0", "asttokens==3.0.2", "attrs==26.1.0",
    "blobfile==3.0.0", "certifi==2026.10.19.post1", "cffi==2.1.1", "charset-normalizer==3.5.3",
    "click==8.5.1", "compressed-tensors==0.20.1", "dill==0.4.1", "distro==1.9.0",
    "docstring_parser==0.18.0", "einops==0.8.2", "executing==2.3.0", "fastapi==0.136.3",
    "filelock==4.3.1", "frozenlist==1.8.0", "fsspec==2026.9.0", "gguf==0.19.0", "h11==0.16.0",
    "hf-xet==1.8.0", "httpcore==1.0.9", "httpcore2==2.16.2", "httpx==0.28.1", "httpx2==2.16.2",
    "huggingface_hub==1.33.0", "idna==3.20", "interegular==0.3.3", "ipython==9.18.1",
    "ipython_pygments_lexers==1.1.1", "jedi==0.20.1", "jinja2==3.1.6", "jiter==0.19.0",
    "jsonschema==4.26.0", "jsonschema-specifications==2025.9.1", "loguru==0.7.3", "lxml==6.1.3",
    "markdown-it-py==4.3.0", "markupsafe==3.0.4", "matplotlib-inline==0.2.2", "mdurl==0.1.2",
    "mpmath==1.3.0", "msgspec==0.23.0", "multidict==7.2.1", "networkx==3.6.1", "numpy==2.4.6",
    "openai==2.6.1", "opentelemetry-api==1.45.2", "orjson==3.13.0", "packaging==26.4", "parso==0.8.7",
    "partial-json-parser==0.2.1.1.post7", "pexpect==4.9.0", "pillow==13.0.0",
    "prometheus_client==0.26.0", "prompt_toolkit==3.0.53", "propcache==0.5.4", "psutil==7.2.2",
    "ptyprocess==0.7.0", "pure_eval==0.2.4", "py-spy==0.4.3", "pybase64==1.5.1", "pycparser==3.12",
    "pycryptodomex==3.24.2", "pydantic==2.14.4", "pydantic_core==2.50.5", "pygments==2.21.0",
    "python-multipart==0.0.34", "pyyaml==6.0.4", "pyzmq==27.3.0", "referencing==0.37.0",
    "regex==2026.11.19", "requests==2.34.2", "rich==15.0.0", "rpds-py==2026.9.1", "safetensors==0.8.0",
    "scipy==1.17.1", "sentencepiece==0.2.3", "setproctitle==1.3.8", "setuptools==84.2.1",
    "shellingham==1.5.4", "sniffio==1.3.1", "soundfile==0.14.0", "stack-data==0.6.3",
    "starlette==1.10.0", "sympy==1.14.0", "tiktoken==0.14.0", "tokenizers==0.22.2", "tqdm==4.70.1",
    "traitlets==5.16.1", "transformers==5.12.1", "truststore==0.10.5", "typer==0.29.2",
    "typing-inspection==0.4.5", "typing_extensions==4.16.0", "urllib3==2.8.0", "uvicorn==0.54.0",
    "uvloop==0.23.0", "watchfiles==1.3.0", "wcwidth==0.9.4", "yarl==1.25.1", "zstandard==0.25.0",
)

# What a release pins differently from 0.5.15 (the reference: 0.5.13 and 0.5.14 ran with these).
RELEASE_OVERRIDES: dict[str, dict[str, str]] = {
    "0.5.13": {"transformers": "5.8.1", "apache-tvm-ffi": "0.1.9"},
    "0.5.13.post1": {"transformers": "5.8.1", "apache-tvm-ffi": "0.1.9"},
    "0.5.14": {"transformers": "5.8.1", "apache-tvm-ffi": "0.1.9"},
    "0.5.15": {},
    "0.5.15.post1": {},
    # The fixed release. Its Requires-Dist pins transformers 5.12.1, apache-tvm-ffi 0.1.11 and
    # xgrammar 0.2.1 as 0.5.15 does; what it adds (numba, helion, humming-kernels, newer
    # flashinfer/flash-attn/quack/deep-gemm, sglang-kernel 0.4.5) is CUDA-only or not imported on
    # this CPU path (numba only by the inkling image processor).
    "0.5.16": {},
}

# Releases whose CPU path imports sgl-kernel's CPU ops at module level (0.5.16:
# srt/mem_cache/allocation.py:46 and kernels/ops/kvcache/cache_move.py:10): their environment gets
# the torch stand-in (forensics.engine.kernel_standin) as one more pinned distribution.
KERNEL_STANDIN_RELEASES = frozenset({"0.5.16"})


def supported_releases() -> list[str]:
    """The releases an engine environment can be built for here (the vulnerable window and 0.5.16)."""
    return list(RELEASE_OVERRIDES)


def _name(requirement: str) -> str:
    return requirement.split("==", 1)[0].lower().replace("_", "-")


def _override(requirements: tuple[str, ...], overrides: dict[str, str]) -> list[str]:
    wanted = {name.lower(): version for name, version in overrides.items()}
    return [f"{requirement.split('==')[0]}=={wanted[_name(requirement)]}" if _name(requirement) in wanted
            else requirement for requirement in requirements]


def check_release(version: str) -> str:
    """``version`` when an engine environment can be built for it, else a UsageProblem naming why."""
    if version not in RELEASE_OVERRIDES:
        raise UsageProblem(
            f"no engine environment is defined for sglang {version}: its pins and CPU adaptations have not "
            f"been worked out and measured here; defined: {', '.join(RELEASE_OVERRIDES)}"
        )
    return version


def install_steps(version: str) -> list[tuple[str, list[str]]]:
    """The pip installs, in order, each ``(step name, requirements)``; every one runs with --no-deps.

    The sglang wheel itself is a separate step (installed from the verified wheel cache)."""
    overrides = RELEASE_OVERRIDES[check_release(version)]
    return [
        ("torch", [TORCH]),
        ("dependencies", _override(DEPENDENCIES, overrides)),
        ("engine extras", _override(ENGINE_EXTRAS, overrides)),
    ]


def needs_kernel_standin(version: str) -> bool:
    return check_release(version) in KERNEL_STANDIN_RELEASES


def expected_versions(version: str) -> dict[str, str]:
    """Each pinned distribution's normalised name and version (torch's local label ignored)."""
    found = {}
    if needs_kernel_standin(version):
        found[kernel_standin.DISTRIBUTION] = kernel_standin.VERSION
    for _step, requirements in install_steps(version):
        for requirement in requirements:
            name, pinned = requirement.split("==", 1)
            found[_name(name)] = pinned
    found["sglang"] = version
    return found


def pin_hash(version: str, adaptation_ids: list[str]) -> str:
    """A short hash of everything that decides the environment's contents (its cache key)."""
    contents: dict = {"steps": install_steps(version), "adaptations": sorted(adaptation_ids)}
    if needs_kernel_standin(version):  # only then: the other releases' keys stay as they were
        contents["kernel stand-in"] = f"{kernel_standin.DISTRIBUTION}=={kernel_standin.VERSION}"
    payload = json.dumps(contents, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]
