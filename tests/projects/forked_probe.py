"""Run forked from a warm Python of the serving venv that imported the vLLM server's modules
(`test_vllm_server`): what the launcher does there (its engine core's start method, its
titles written in place), then an engine core started as vLLM starts one, titling itself as
vLLM does; prints what it saw."""

from __future__ import annotations

import sys


def main(out: str) -> None:
    """Print the hook's words, the start method, then the engine core's title."""
    import vllm.v1.engine.utils as engine_utils

    from projects.llm_serving.workload import vllm_server
    from tests.projects import env_probe

    assert vllm_server.preloaded()
    print(vllm_server.install_engine_core_hook(fork=True))
    vllm_server._title_in_place()
    context = engine_utils.get_mp_context()
    print(context.get_start_method())
    child = context.Process(target=env_probe.write_vllm_title, args=(out,), kwargs={
        "cmdline": True})
    child.start()
    child.join()
    print(open(out).read(), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
