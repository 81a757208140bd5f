"""llama-cpp-python's OpenAI-compatible server as scripts/local_llm.sh runs it, with two changes.

- The RAM prompt cache counts a saved state whole (KV cache, logits, ids); the server counts the
  KV cache alone, and filled 23 GB in 20 minutes.
- With --draft_model prompt-lookup-decoding, a draft is the tokens that followed the latest earlier
  occurrence of the longest n-gram (8 to 3 tokens) that ends the text so far, and logits are computed
  only where they are sampled. A small model often writes its parent out again with a few lines
  changed; the parent's next tokens are then checked in one batch. The library's own drafter takes
  the first occurrence of a 2-gram, and its logits for every prompt token slowed prompts by a third
  (and, with --logits_all False, failed on its first draft).
"""
import sys

import numpy as np
import llama_cpp.llama as llama
import llama_cpp.llama_cache as cache
import llama_cpp.llama_speculative as speculative
from llama_cpp.server.__main__ import main

cache.LlamaRAMCache.cache_size = property(lambda self: sum(
    s.llama_state_size + s.scores.nbytes + s.input_ids.nbytes for s in self.cache_state.values()))

NGRAMS = (8, 6, 4, 3)
CHECKED = 24        # an eval this short is a draft being checked: logits for each token


class Lookup(speculative.LlamaDraftModel):
    def __init__(self, max_ngram_size: int = 8, num_pred_tokens: int = 10):
        self.num_pred_tokens = num_pred_tokens

    def __call__(self, input_ids, /, **kwargs):
        ids = np.asarray(input_ids)
        for k in NGRAMS:
            if len(ids) <= k + 1:
                continue
            windows = np.lib.stride_tricks.sliding_window_view(ids[:-1], k)
            hits = np.nonzero(np.all(windows == ids[-k:], axis=1))[0]
            if len(hits):
                follow = ids[hits[-1] + k:hits[-1] + k + self.num_pred_tokens]
                if len(follow):
                    return follow.astype(np.intc)
        return np.array([], dtype=np.intc)


def sampled_eval(self, tokens):
    """Llama.eval with logits only where generate() samples: the last token of a prompt, every
    token of a draft."""
    self._ctx.kv_cache_seq_rm(-1, self.n_tokens, -1)
    every = len(tokens) <= CHECKED
    for i in range(0, len(tokens), self.n_batch):
        batch = tokens[i:i + self.n_batch]
        n_past = self.n_tokens
        self._batch.set_batch(batch=batch, n_past=n_past, logits_all=every)
        self._ctx.decode(self._batch)
        self.input_ids[n_past:n_past + len(batch)] = batch
        self.n_tokens += len(batch)
        self._requires_eval = False


if "--draft_model" in sys.argv:
    speculative.LlamaPromptLookupDecoding = Lookup
    llama.Llama.eval = sampled_eval

if __name__ == "__main__":
    sys.exit(main())
