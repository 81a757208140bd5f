"""llama-cpp-python's OpenAI-compatible server as scripts/local_llm.sh runs it: its RAM prompt
cache counts a saved state whole (KV cache, logits, ids), where the server counts the KV cache
alone and filled 23 GB in 20 minutes.

Prompt-lookup drafts (--draft_model prompt-lookup-decoding, with a drafter that follows the latest
8-gram) were tried here on 2 cores and left out: checked on the model's one core they made
answers that copy little 20-37 % slower, and on all cores they took the core kfray times on.
"""
import sys

import llama_cpp.llama_cache as cache
from llama_cpp.server.__main__ import main

cache.LlamaRAMCache.cache_size = property(lambda self: sum(
    s.llama_state_size + s.scores.nbytes + s.input_ids.nbytes for s in self.cache_state.values()))

if __name__ == "__main__":
    sys.exit(main())
