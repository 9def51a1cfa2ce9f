// The transport-free ring (src/distributed/ring_plan.h) for Python: the options and sharding that
// qkv.distributed (over MPI) and qkv.torch's ring (over torch.distributed) share, and the steps of
// one rank, which qkv.torch drives while torch.distributed moves the K/V shards and dK/dV sums.
// Arrays are float32 [B, H, n, D], like the MPI ring's.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bare_new.h"
#include "bind_mask.h"
#include "bindings.h"
#include "gil_release.h"
#include "distributed/ring_plan.h"
#include "qkv/options_parse.h"

namespace py = pybind11;

namespace {

using Array = py::array_t<float, py::array::c_style | py::array::forcecast>;

template <class T = const float>
qkv::TensorView<T> view(const Array& a, int rank, const char* name) {
  if (a.ndim() != rank) throw qkv::Error(std::string(name) + ": expected a " + std::to_string(rank) + "-D array");
  T* data = const_cast<T*>(a.data());
  return qkv::TensorView<T>(data, std::span<const int64_t>(reinterpret_cast<const int64_t*>(a.shape()), rank));
}

Array new_array(std::vector<int64_t> shape) { return Array(std::vector<py::ssize_t>(shape.begin(), shape.end())); }

qkv::Sharding sharding_of(const std::string& name) {
  if (name != "zigzag" && name != "contiguous")
    throw py::value_error("sharding must be 'zigzag' or 'contiguous', got '" + name + "'");
  return name == "zigzag" ? qkv::Sharding::zigzag : qkv::Sharding::contiguous;
}

// Mask and options from the keyword arguments the Python wrappers forward (global positions),
// by the rules every front end shares (qkv/options_parse.h); `dropout` holds the keys dropout_p,
// dropout_seed and dropout_offset of the main module's options dict.
qkv::RingOptions ring_options(bool causal, const std::string& align, std::optional<std::pair<int64_t, int64_t>> window,
                              std::vector<int64_t> key_lengths, std::vector<int64_t> query_lengths,
                              const std::vector<double>& alibi_slopes, double softcap, std::optional<double> scale,
                              int num_threads, const std::string& sharding, const py::dict& dropout) {
  qkv::RingOptions o;
  o.attention.dropout = qkvpy::dropout_arg(dropout);
  const qkv::CausalAlign a = qkv::parse_causal_align(align);
  o.sharding = sharding_of(sharding);
  if (causal) o.attention.mask.causal = a;
  o.attention.mask.diagonal = a;
  if (window) o.attention.mask.window = qkv::Window{window->first, window->second};
  o.attention.mask.key_lengths = std::move(key_lengths);
  o.attention.mask.query_lengths = std::move(query_lengths);
  for (std::size_t i = 0; i < alibi_slopes.size(); ++i)
    o.attention.mask.alibi_slopes.push_back(qkv::alibi_slope_value(alibi_slopes[i], i));
  o.attention.mask.softcap = qkv::softcap_value(softcap);
  o.attention.scale = scale;
  o.attention.num_threads = num_threads;
  return o;
}

// The plan from the agreed table (ring_plan.h's plan_from_table), checked against this rank's q.
qkv::ring::Plan plan_of(const std::vector<int64_t>& table, int ranks, int rank, const qkv::RingOptions& o,
                        const Array& q) {
  qkv::ring::Plan plan = qkv::ring::plan_from_table(table, ranks, rank, o);
  const std::array<int64_t, 4> want{plan.B, plan.H, plan.q_tokens(rank), plan.D};
  qkv::require_shape(view(q, 4, "q").shape(), want, "ring: q (this rank's row of the table)");
  return plan;
}

// A K/V shard of rank src as received: k [B,Hkv,Mr,D] and v [B,Hkv,Mr,Dv], contiguous.
qkv::ring::ShardAt shard_of(const qkv::ring::Plan& plan, int src, const Array& k, const Array& v) {
  if (src < 0 || src >= plan.ranks) throw qkv::Error("ring step: src " + std::to_string(src) + " is not a rank");
  const int64_t Mr = plan.kv_tokens(src);
  const std::array<int64_t, 4> want_k{plan.B, plan.Hkv, Mr, plan.D}, want_v{plan.B, plan.Hkv, Mr, plan.Dv};
  qkv::require_shape(view(k, 4, "k").shape(), want_k, "ring step: k");
  qkv::require_shape(view(v, 4, "v").shape(), want_v, "ring step: v");
  return {k.data(), v.data()};
}

// One rank's forward: the arrays it reads and writes live as long as the steps.
struct Forward {
  qkv::RingOptions options;
  qkv::ring::Plan plan;
  Array q, out;
  std::unique_ptr<qkv::ring::ForwardSteps> steps;
};

struct Backward {
  qkv::RingOptions options;
  qkv::ring::Plan plan;
  Array dout, q, out, lse, dq;
  std::unique_ptr<qkv::ring::BackwardSteps> steps;
};

}  // namespace

namespace qkvpy {

void bind_ring(py::module_& m) {
  m.def("_ring_options", &ring_options);
  py::class_<qkv::RingOptions> options(m, "_RingOptions");
  refuse_bare_new(options);
  m.def("_shard_ranges", [](int64_t length, int ranks, int rank, const std::string& sharding) {
    std::vector<std::pair<int64_t, int64_t>> out;
    for (const qkv::TokenRange& r : qkv::shard_ranges(length, ranks, rank, sharding_of(sharding)))
      out.emplace_back(r.begin, r.end);
    return out;
  });
  // This rank's row of the agreement (ring_plan.h's plan_row): ValueError for a bad argument.
  m.def("_ring_row", [](const Array& q, const Array& k, const Array& v, const qkv::RingOptions& o) {
    const qkv::ring::PlanRow row =
        qkv::ring::plan_row(view(q, 4, "q"), view(k, 4, "k"), view(v, 4, "v"), o, [](const qkv::AttentionShape&) {});
    return std::vector<int64_t>(row.begin(), row.end());
  });

  // The shapes of rank r's k and v shards, from the agreed table (rows as plan_row makes them).
  m.def("_ring_kv_shapes", [](const std::vector<int64_t>& table, int r) {
    if (r < 0 || static_cast<std::size_t>(r + 1) * qkv::ring::kPlanFields > table.size())
      throw qkv::Error("ring: rank " + std::to_string(r) + " has no row in the table");
    const int64_t* row = table.data() + static_cast<std::size_t>(r) * qkv::ring::kPlanFields;
    const int64_t B = row[0], Hkv = row[2], D = row[3], Dv = row[4], Mr = row[6];
    return py::make_tuple(py::make_tuple(B, Hkv, Mr, D), py::make_tuple(B, Hkv, Mr, Dv));
  });

  py::class_<Forward> forward(m, "_RingForward");
  refuse_bare_new(forward);
  forward
      .def_static(
          "start",
          [](const std::vector<int64_t>& table, int ranks, int rank, const Array& q, const qkv::RingOptions& o) {
            auto f = std::make_unique<Forward>();
            f->options = o;
            f->q = q;
            f->plan = plan_of(table, ranks, rank, f->options, f->q);
            const auto qv = view(f->q, 4, "q");
            f->out = new_array({qv.dim(0), qv.dim(1), qv.dim(2), f->plan.Dv});
            f->steps =
                std::make_unique<qkv::ring::ForwardSteps>(f->plan, f->options, view<float>(f->out, 4, "out"), qv);
            return f;
          })
      .def("step",
           [](Forward& f, int src, const Array& k, const Array& v) {
             const qkv::ring::ShardAt shard = shard_of(f.plan, src, k, v);
             qkvpy::GilRelease release;
             f.steps->step(src, shard);
           })
      .def("finish", [](Forward& f) {
        const auto qv = view(f.q, 4, "q");
        Array lse = new_array({qv.dim(0), qv.dim(1), qv.dim(2)});
        f.steps->finish(view<float>(lse, 3, "lse"));
        return py::make_tuple(f.out, lse);
      });

  py::class_<Backward> backward(m, "_RingBackward");
  refuse_bare_new(backward);
  backward
      .def_static("start",
                  [](const std::vector<int64_t>& table, int ranks, int rank, const Array& dout, const Array& q,
                     const Array& out, const Array& lse, const qkv::RingOptions& o) {
                    auto b = std::make_unique<Backward>();
                    b->options = o;
                    b->plan = plan_of(table, ranks, rank, b->options, q);
                    b->dout = dout, b->q = q, b->out = out, b->lse = lse;
                    const auto qv = view(b->q, 4, "q");
                    const qkv::ring::Plan& p = b->plan;
                    const std::array<int64_t, 4> want_out{p.B, p.H, qv.dim(2), p.Dv};
                    qkv::require_shape(view(b->dout, 4, "dout").shape(), want_out, "ring backward: dout");
                    qkv::require_shape(view(b->out, 4, "out").shape(), want_out, "ring backward: out");
                    qkv::require_shape(view(b->lse, 3, "lse").shape(), std::array<int64_t, 3>{p.B, p.H, qv.dim(2)},
                                       "ring backward: lse");
                    b->dq = new_array({qv.dim(0), qv.dim(1), qv.dim(2), qv.dim(3)});
                    b->steps = std::make_unique<qkv::ring::BackwardSteps>(
                        b->plan, b->options, view<float>(b->dq, 4, "dq"), view(b->dout, 4, "dout"), qv,
                        view(b->out, 4, "out"), view(b->lse, 3, "lse"));
                    return b;
                  })
      // This rank's part of the dK/dV of rank src's shard, as (dk, dv).
      .def("step",
           [](Backward& b, int src, const Array& k, const Array& v) {
             const qkv::ring::ShardAt shard = shard_of(b.plan, src, k, v);
             const qkv::ring::Plan& p = b.plan;
             const int64_t Mr = p.kv_tokens(src);
             Array dk = new_array({p.B, p.Hkv, Mr, p.D}), dv = new_array({p.B, p.Hkv, Mr, p.Dv});
             {
               qkvpy::GilRelease release;
               b.steps->step(src, shard, dk.mutable_data(), dv.mutable_data());
             }
             return py::make_tuple(dk, dv);
           })
      .def("finish", [](Backward& b) {
        b.steps->finish();
        return b.dq;
      });
}

}  // namespace qkvpy
