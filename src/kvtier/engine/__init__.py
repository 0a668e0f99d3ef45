"""The reference engine: a tiny hybrid transformer with paged, per-group KV and states.

It exists to prove, on a real forward pass, that a request restored from kvtier's tiers
produces the same logits and tokens as the same request computed cold. It needs the
``torch`` extra; no other kvtier package imports torch.

Build an engine and its matching kvtier layout from one config::

    from kvtier.engine import Engine, EngineConfig, GroupSpec

    config = EngineConfig(groups=(
        GroupSpec("full", num_layers=1, tokens_per_block=4, blocks_per_chunk=2),
        GroupSpec("sliding_window", num_layers=2, tokens_per_block=4, window=6),
        GroupSpec("state", num_layers=2, tokens_per_block=4),   # recurrent layers
    ))
    layout = config.layout()            # kvtier.layout.Layout, sizes filled in
    engine = Engine(config, offloader)  # offloader: any kvtier.engine.Offloader
    completions = engine.generate([[1, 2, 3, 4, 5, 6, 7, 8, 9]], max_tokens=4)

See ``kvtier.engine.hooks`` for the offloader protocol and its call order.
"""

from kvtier.engine.blocks import OutOfBlocksError
from kvtier.engine.config import AttentionKind, EngineConfig, GroupSpec
from kvtier.engine.engine import Engine
from kvtier.engine.hooks import NullOffloader, Offloader
from kvtier.engine.model import TinyModel, dense_logits, reference_generate
from kvtier.engine.request import BlockIds, BlockTables, Completion, Request, RequestStatus

__all__ = [
    "AttentionKind",
    "BlockIds",
    "BlockTables",
    "Completion",
    "Engine",
    "EngineConfig",
    "GroupSpec",
    "NullOffloader",
    "Offloader",
    "OutOfBlocksError",
    "Request",
    "RequestStatus",
    "TinyModel",
    "dense_logits",
    "reference_generate",
]
