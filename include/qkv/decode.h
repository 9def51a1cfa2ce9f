// Decode attention: a few new queries per sequence (1-16: one token, speculative drafts, chunked
// prefill) against keys and values held in a paged cache (kv_cache.h builds one). The layout is
// vLLM's PagedAttention / flash_attn_with_kvcache: a pool of pages [pages, Hkv, page_tokens, D]
// for K and [pages, Hkv, page_tokens, Dv] for V, and a block table per sequence listing its pages.
// Letters as in attention.h; N is the number of new queries, the same for every sequence.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "qkv/attention.h"
#include "qkv/kv_dtype.h"
#include "qkv/tensor.h"

namespace qkv {

// A borrowed description of B sequences in a page pool. The pools and scales belong to the
// caller (usually a KVCache) and must outlive the call that reads them; nothing here owns them.
struct PagedKV {
  KVDtype dtype = KVDtype::f32;
  int64_t num_pages = 0, page_tokens = 0, Hkv = 0, D = 0, Dv = 0;
  const void* k = nullptr;         // [num_pages, Hkv, page_tokens, D] of dtype
  const void* v = nullptr;         // [num_pages, Hkv, page_tokens, Dv] of dtype
  const float* k_scale = nullptr;  // i8 only: [num_pages, Hkv, page_tokens]
  const float* v_scale = nullptr;
  // Tokens of each sequence (size B); a sequence's token t lives in page
  // block_table[b * max_blocks + t / page_tokens], slot t % page_tokens.
  std::vector<int64_t> seq_lens;
  std::vector<int32_t> block_table;  // [B, max_blocks], row-major
  int64_t max_blocks = 0;

  int64_t batch() const { return static_cast<int64_t>(seq_lens.size()); }
};

struct DecodeOptions {
  // Scale (unset: 1/sqrt(D)), mask, threads (0: default_num_threads(); the result is bitwise the
  // same for any count; a short step uses fewer) and SIMD path, as for attention_forward. Mask:
  // causal (bottom_right: query i of N sits at position len - N + i, i.e. the new tokens' keys are
  // already appended), window, alibi_slopes, softcap, query_lengths, keep and bias ([B, H, N, max
  // len] views); key_lengths must be empty: the sequence lengths are the key lengths. Decode runs
  // the fused kernel and has no dropout: Kernel::reference and an active dropout are refused.
  AttentionOptions attention;
  // Attention sinks (gpt-oss): one learned logit per query head (size H, or empty) that joins
  // every row's softmax denominator and attends to nothing, so out = Σ p_j v_j with
  // Σ p_j = L / (L + e^sink) < 1. lse includes it: lse = log(Σ e^s_j + e^sink). Each is finite
  // or -inf (no sink for that head); NaN and +inf are refused.
  std::vector<float> sinks;
  // StreamingLLM: the first `sink_tokens` keys of every sequence stay visible to every query in
  // addition to its causal/window band (they still obey causality and the sequence length).
  int64_t sink_tokens = 0;
};

// out [B,H,N,Dv] = attention of q [B,H,N,D] over each sequence's cached keys and values;
// lse [B,H,N] is written unless empty. Any strides for q, out, lse. Requires a KVDtype dtype
// (require_kv_dtype), no negative dimension, H % Hkv == 0, q's D and out's Dv equal to the
// pool's, pools and a block table [B, max_blocks] whose sizes fit in 2^62 bytes, every block
// table entry a sequence uses inside [0, num_pages), seq_lens[b] <= max_blocks * page_tokens.
// Throws qkv::Error naming the fault otherwise, and also for a non-finite q or a result that
// overflowed fp32 (out may then be partly written). A row with no allowed key (keys a keep-mask
// or a -inf bias removes are not allowed) gets out = 0 and lse = -inf, with or without a sink; a
// row whose allowed keys all score below -FLT_MAX is refused as an overflow.
// Work is split into (sequence, KV head, key chunk) tasks whose chunk plan depends on the sequence
// lengths only, and the chunks' partial results are merged in a fixed order: bitwise the same
// result for any thread count. Allocates O(B·H·N·Dv) scratch, never O(sequence length).
// Thread-safe for distinct outputs.
void decode_attention(TensorView<float> out, TensorView<float> lse, TensorView<const float> q, const PagedKV& kv,
                      const DecodeOptions& options = {});

// Exact weights of the new queries over each sequence's keys (for explain tooling and KV
// eviction policies such as H2O's heavy hitters): weights [B,H,N,max len] with
// weights(b,h,i,j) = exp(s_ij - lse_bhi) for allowed keys j < seq_lens[b], else 0; the same
// masks, sinks and sink_tokens as decode_attention (with sinks a row sums to 1 - e^(sink - lse)).
// Scores in float64 from the stored (dequantized) values. lse [B,H,N] as decode_attention wrote
// it, or empty to recompute it in float64. Memory: O(max len) per row besides `weights`. The same
// checks and errors as decode_attention. Thread-safe for distinct outputs; single-threaded.
void decode_attention_weights(TensorView<float> weights, TensorView<const float> q, const PagedKV& kv,
                              TensorView<const float> lse, const DecodeOptions& options = {});

// The top_k largest of those weights per row, without the [B,H,N,max len] matrix (O(max len)
// memory): values [B,H,N,top_k] (largest first; ties: the lower key first) and indices
// [B,H,N,top_k] (key positions in the sequence; past a row's allowed keys, value 0 and index -1).
// Allowed as attention_weights_topk counts them: in the row's band or StreamingLLM prefix and not
// removed by the keep-mask or a -inf bias, so a key whose weight underflowed to 0 keeps its index.
// Throws qkv::Error for top_k < 1, mismatched output shapes, and as decode_attention_weights.
// Thread-safe for distinct outputs; single-threaded.
void decode_attention_top_k(TensorView<float> values, TensorView<int64_t> indices, TensorView<const float> q,
                            const PagedKV& kv, TensorView<const float> lse, int64_t top_k,
                            const DecodeOptions& options = {});

}  // namespace qkv
