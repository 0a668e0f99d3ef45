"""A separate engine process for the cross-process tier tests: generates one prompt with
kvtier configured by argv's JSON and prints one JSON line with the tokens, the hit, the time
to first token, the chunks promoted by tier, and the keys (hex) of the prompt's whole chunks
in order (so that a test can tell which Redis Cluster node holds which).

    python tier_engine_child.py MODEL_DIR '{"prompt": [...], "extra": {...}}'
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from engine_helpers import Engine

from kvtier.keys import KeyChain


def main() -> None:
    model, spec = Path(sys.argv[1]), json.loads(sys.argv[2])
    prompt = spec["prompt"]
    engine = Engine(model, num_blocks=spec.get("num_blocks", 14),
                    max_model_len=spec.get("max_model_len", 1024), llm_args=spec.get("llm_args"),
                    **spec["extra"])
    out = engine.generate([prompt], max_tokens=spec.get("max_tokens", 8))[0]
    scheduler = engine.scheduler.connector.scheduler
    promoted = dict(scheduler.tiers.promoted)
    layout = scheduler.planner.layout
    chain = KeyChain(layout, scheduler.planner.namespace, prompt)
    keys = [k.hex() for k in chain.keys(0, range(len(prompt) // layout.groups[0].tokens_per_chunk))]
    engine.close()
    print(json.dumps({"tokens": list(out.tokens), "num_cached": out.num_cached,
                      "ttft_s": out.ttft_s, "promoted": promoted, "keys": keys}))


if __name__ == "__main__":
    main()
