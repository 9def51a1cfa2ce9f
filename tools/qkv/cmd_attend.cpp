// `qkv attend`: attention on tensors from .npy files. fp64 inputs with --kernel reference are
// computed and written in float64 (the oracle, for numpy comparisons); everything else in fp32.
#include <array>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli_mask.h"
#include "cli_util.h"
#include "commands.h"
#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/io.h"
#include "qkv/reference.h"
#include "qkv/weights.h"
#ifdef QKV_HAVE_MPI
#include "ring/attend_ring.h"
#endif

namespace qkv::cli {
namespace {

struct AttendArgs {
  std::string q, k, v, out, weights, lse;
  std::string kernel = "auto";
  double scale = 0.0;
  bool has_scale = false;
  int threads = 0;
  bool ring = false;
  MaskArgs mask;
};

// A loaded input and its view as [B, H, N, D].
template <class T>
struct Input {
  std::string path;
  Tensor<T> data;
  TensorView<const T> view4;
};

template <class T>
Input<T> load_input(const std::string& path, const char* option) {
  // Integers and booleans would load (load_npy converts them), but attention on them is almost
  // certainly a wrong file; Python refuses them too.
  const std::string descr = read_npy_info(path).descr;
  if (descr.size() < 2 || descr[1] != 'f')
    throw Error(
        fmt::format("{} {}: holds dtype '{}'; attention needs floating-point values (float16, float32 or "
                    "float64)",
                    option, path, descr));
  Input<T> in{path, load_npy<T>(path), {}};
  const int rank = in.data.rank();
  if (rank < 2 || rank > 4)
    throw Error(fmt::format("{} {}: expected a 2-D [N, D], 3-D [H, N, D] or 4-D [B, H, N, D] array, got shape {}",
                            option, path, shape_string(in.data.shape())));
  check_finite(in.data.cview(), path);
  in.view4 = in.data.cview().as_rank4();
  // as_rank4 gives the new leading dims stride 0; any stride is fine for size-1 dims.
  return in;
}

// The input's leading dims (all but the last) followed by `tail`.
std::vector<int64_t> output_shape(std::span<const int64_t> q_shape, std::initializer_list<int64_t> tail) {
  std::vector<int64_t> shape(q_shape.begin(), q_shape.end() - 1);
  shape.insert(shape.end(), tail);
  return shape;
}

// Computes out/lse/weights in T and returns the files to write.
template <class T>
std::vector<std::pair<std::string, std::string>> attend(AttendArgs& a) {
  const Input<T> q = load_input<T>(a.q, "--q"), k = load_input<T>(a.k, "--k"), v = load_input<T>(a.v, "--v");
  if (k.data.rank() != q.data.rank() || v.data.rank() != q.data.rank())
    throw Error(
        fmt::format("--q {}, --k {}, --v {}: ranks differ ({}, {}, {}); give all three as [N, D], [H, N, D] "
                    "or [B, H, N, D]",
                    a.q, a.k, a.v, q.data.rank(), k.data.rank(), v.data.rank()));
  AttentionOptions options;
  if (a.has_scale) options.scale = a.scale;
  options.kernel = parse_kernel(a.kernel, "--kernel");
  options.num_threads = a.threads;
  AttentionShape s;
  try {
    s = check_attention_shapes(q.view4.shape(), k.view4.shape(), v.view4.shape(), options);
  } catch (const Error& e) {
    throw Error(fmt::format("--q {} {}, --k {} {}, --v {} {}: {}", a.q, shape_string(q.data.shape()), a.k,
                            shape_string(k.data.shape()), a.v, shape_string(v.data.shape()), e.what()));
  }
  options.mask = build_mask(a.mask, s.B, s.H, s.N, s.M);
  try {
    check_attention_shapes(q.view4.shape(), k.view4.shape(), v.view4.shape(), options);
  } catch (const Error& e) {
    throw Error(fmt::format("mask options for q {} and k {}: {}", shape_string(q.data.shape()),
                            shape_string(k.data.shape()), e.what()));
  }

  const std::array<int64_t, 4> out_shape4{s.B, s.H, s.N, s.Dv};
  const std::array<int64_t, 3> lse_shape3{s.B, s.H, s.N};
  const std::array<int64_t, 4> weights_shape4{s.B, s.H, s.N, s.M};
  Tensor<T> out(out_shape4, "out"), lse(lse_shape3, "lse");
  Tensor<T> weights;
  if (!a.weights.empty()) weights = Tensor<T>(weights_shape4, "weights");
  if constexpr (std::is_same_v<T, double>) {
    reference_attention_forward(out.view(), lse.view(), weights.view(), q.view4, k.view4, v.view4, options);
  } else {
    attention_forward(out.view(), lse.view(), q.view4, k.view4, v.view4, options);
    if (!a.weights.empty() && weights.numel() > 0) {
      // attention_forward never materializes the weights; recompute every row, with each row's
      // lse recomputed in float64 so the weights are exact rather than tied to the fp32 lse.
      std::vector<int64_t> rows(static_cast<std::size_t>(s.N));
      for (int64_t i = 0; i < s.N; ++i) rows[static_cast<std::size_t>(i)] = i;
      attention_weights_rows(weights.view(), q.view4, k.view4, {}, rows, options);
    }
  }
  // Finite inputs can still overflow (huge scores); never hand back a silent NaN.
  check_finite(out.cview(), fmt::format("output of attention (inputs too large for {})",
                                        std::is_same_v<T, double> ? "float64" : "float32"));

  const std::vector<int64_t> o_shape = output_shape(q.data.shape(), {s.Dv});
  const std::vector<int64_t> l_shape = output_shape(q.data.shape(), {});
  const std::vector<int64_t> w_shape = output_shape(q.data.shape(), {s.M});
  std::vector<std::pair<std::string, std::string>> files;
  files.emplace_back(a.out, npy_bytes<T>(TensorView<const T>(out.data(), o_shape)));
  if (!a.lse.empty()) files.emplace_back(a.lse, npy_bytes<T>(TensorView<const T>(lse.data(), l_shape)));
  if (!a.weights.empty()) files.emplace_back(a.weights, npy_bytes<T>(TensorView<const T>(weights.data(), w_shape)));
  return files;
}

int run_ring(AttendArgs& a) {
  if (!a.weights.empty()) throw Error("--weights cannot be combined with --ring (the weights are N×M)");
  if (a.kernel == "reference") throw Error("--kernel reference cannot be combined with --ring");
#ifdef QKV_HAVE_MPI
  const std::optional<double> scale = a.has_scale ? std::optional<double>(a.scale) : std::nullopt;
  return run_attend_ring({a.q, a.k, a.v, a.out, a.lse, scale, a.threads}, a.mask);
#else
  throw Error("--ring: this qkv was built without MPI (install libopenmpi-dev and rebuild)");
#endif
}

int run_attend(AttendArgs& a) {
  if (a.ring) return run_ring(a);
  check_output_paths(
      {{"--out", a.out}, {"--lse", a.lse}, {"--weights", a.weights}},
      {{"--q", a.q}, {"--k", a.k}, {"--v", a.v}, {"--keep-mask", a.mask.keep_mask_path}, {"--bias", a.mask.bias_path}});

  bool all_f64 = true;
  for (const std::string* path : {&a.q, &a.k, &a.v}) all_f64 &= read_npy_info(*path).descr == "<f8";
  const bool f64 = all_f64 && a.kernel == "reference";
  write_outputs(f64 ? attend<double>(a) : attend<float>(a));
  return 0;
}

}  // namespace

Command add_attend(CLI::App& app) {
  auto args = std::make_shared<AttendArgs>();
  CLI::App* sub = app.add_subcommand(
      "attend",
      "Attention on .npy tensors: q [N,D], [H,N,D] or [B,H,N,D]; k, v with Hkv heads (H % Hkv == 0) and M keys.\n"
      "fp64 inputs with --kernel reference are computed and written in float64; otherwise float32.\n"
      "N = 0 gives an empty [.., 0, Dv] output; M = 0 or a row with no allowed key gives zeros and lse = -inf.\n"
      "Inputs with NaN/Inf are refused; outputs are written only if the whole run succeeds.");
  sub->add_option("--q", args->q, "Queries .npy")->required();
  sub->add_option("--k", args->k, "Keys .npy")->required();
  sub->add_option("--v", args->v, "Values .npy")->required();
  sub->add_option("--out", args->out, "Output .npy [.., N, Dv]")->required();
  sub->add_option("--weights", args->weights, "Also write the attention weights [.., N, M] (.npy)");
  sub->add_option("--lse", args->lse, "Also write the log-sum-exp per row [.., N] (.npy); -inf for masked rows");
  CLI::Option* scale = sub->add_option("--scale", args->scale, "Score scale (default 1/sqrt(D))");
  sub->add_option("--kernel", args->kernel, "auto, reference (float64 oracle) or fused")
      ->check(CLI::IsMember({"auto", "reference", "fused"}));
  sub->add_option("--threads", args->threads, "Threads (default QKV_NUM_THREADS or all cores)")
      ->check(integer_in(1, 4096));
  sub->add_flag("--ring", args->ring,
                "Ring attention across MPI ranks: run as `mpirun -np P qkv attend --ring ...`; each rank reads only\n"
                "its zigzag shard of float32 q, k, v and the output is written once, in sequence order");
  add_mask_options(sub, args->mask);
  return {sub, [args, scale] {
            args->has_scale = scale->count() > 0;
            return run_attend(*args);
          }};
}

}  // namespace qkv::cli
