// The only translation unit of libmalle/elastic that includes torch::optim's
// concrete optimizers.
#include "libmalle/elastic/optimizer_state.h"

#include <memory>
#include <optional>
#include <tuple>
#include <vector>

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include "absl/strings/str_cat.h"
#include "libmalle/base/status_macros.h"

namespace malle::elastic {
namespace {

namespace optim = torch::optim;

// One parameter's state, kind-independent: integers (step counts) and tensors.
struct ParamRecord {
  bool present = false;
  std::vector<int64_t> ints;
  std::vector<at::Tensor> tensors;
};

// Per optimizer kind: how options and per-parameter state map to numbers and
// tensors. Adding an optimizer means adding one of these.
struct Codec {
  const char* kind;
  bool (*matches)(const optim::Optimizer&);
  std::vector<double> (*get_options)(const optim::OptimizerOptions&);
  void (*set_options)(optim::OptimizerOptions&, const std::vector<double>&);
  size_t num_options;
  ParamRecord (*get_state)(const optim::OptimizerParamState&);
  // Keeps the record's tensors themselves (views of the unpacked segments, no
  // copy): the optimizer's state is then one buffer per dtype, which the next
  // state sync sends as it is.
  std::unique_ptr<optim::OptimizerParamState> (*make_state)(const ParamRecord&);
  size_t num_ints;
  size_t num_tensors;
};

template <typename Options, typename State>
struct AdamLike {
  static std::vector<double> GetOptions(const optim::OptimizerOptions& o) {
    const auto& a = static_cast<const Options&>(o);
    return {a.lr(), std::get<0>(a.betas()), std::get<1>(a.betas()), a.eps(), a.weight_decay(),
            a.amsgrad() ? 1.0 : 0.0};
  }
  static void SetOptions(optim::OptimizerOptions& o, const std::vector<double>& v) {
    auto& a = static_cast<Options&>(o);
    a.lr(v[0]).betas(std::make_tuple(v[1], v[2])).eps(v[3]).weight_decay(v[4]).amsgrad(v[5] != 0);
  }
  static ParamRecord GetState(const optim::OptimizerParamState& s) {
    const auto& a = static_cast<const State&>(s);
    return {true, {a.step()}, {a.exp_avg(), a.exp_avg_sq(), a.max_exp_avg_sq()}};
  }
  static std::unique_ptr<optim::OptimizerParamState> MakeState(const ParamRecord& r) {
    auto s = std::make_unique<State>();
    s->step(r.ints[0]);
    s->exp_avg(r.tensors[0]);
    s->exp_avg_sq(r.tensors[1]);
    s->max_exp_avg_sq(r.tensors[2]);
    return s;
  }
};

std::vector<double> SgdOptions(const optim::OptimizerOptions& o) {
  const auto& a = static_cast<const optim::SGDOptions&>(o);
  return {a.lr(), a.momentum(), a.dampening(), a.weight_decay(), a.nesterov() ? 1.0 : 0.0};
}
void SetSgdOptions(optim::OptimizerOptions& o, const std::vector<double>& v) {
  static_cast<optim::SGDOptions&>(o).lr(v[0]).momentum(v[1]).dampening(v[2]).weight_decay(v[3]).nesterov(
      v[4] != 0);
}
ParamRecord SgdState(const optim::OptimizerParamState& s) {
  return {true, {}, {static_cast<const optim::SGDParamState&>(s).momentum_buffer()}};
}
std::unique_ptr<optim::OptimizerParamState> MakeSgdState(const ParamRecord& r) {
  auto s = std::make_unique<optim::SGDParamState>();
  s->momentum_buffer(r.tensors[0]);
  return s;
}

std::vector<double> RmspropOptions(const optim::OptimizerOptions& o) {
  const auto& a = static_cast<const optim::RMSpropOptions&>(o);
  return {a.lr(), a.alpha(), a.eps(), a.weight_decay(), a.momentum(), a.centered() ? 1.0 : 0.0};
}
void SetRmspropOptions(optim::OptimizerOptions& o, const std::vector<double>& v) {
  static_cast<optim::RMSpropOptions&>(o).lr(v[0]).alpha(v[1]).eps(v[2]).weight_decay(v[3]).momentum(v[4]).centered(
      v[5] != 0);
}
ParamRecord RmspropState(const optim::OptimizerParamState& s) {
  const auto& a = static_cast<const optim::RMSpropParamState&>(s);
  return {true, {a.step()}, {a.square_avg(), a.momentum_buffer(), a.grad_avg()}};
}
std::unique_ptr<optim::OptimizerParamState> MakeRmspropState(const ParamRecord& r) {
  auto s = std::make_unique<optim::RMSpropParamState>();
  s->step(r.ints[0]);
  s->square_avg(r.tensors[0]);
  s->momentum_buffer(r.tensors[1]);
  s->grad_avg(r.tensors[2]);
  return s;
}

std::vector<double> AdagradOptions(const optim::OptimizerOptions& o) {
  const auto& a = static_cast<const optim::AdagradOptions&>(o);
  return {a.lr(), a.lr_decay(), a.weight_decay(), a.initial_accumulator_value(), a.eps()};
}
void SetAdagradOptions(optim::OptimizerOptions& o, const std::vector<double>& v) {
  static_cast<optim::AdagradOptions&>(o).lr(v[0]).lr_decay(v[1]).weight_decay(v[2]).initial_accumulator_value(
      v[3]).eps(v[4]);
}
ParamRecord AdagradState(const optim::OptimizerParamState& s) {
  const auto& a = static_cast<const optim::AdagradParamState&>(s);
  return {true, {a.step()}, {a.sum()}};
}
std::unique_ptr<optim::OptimizerParamState> MakeAdagradState(const ParamRecord& r) {
  auto s = std::make_unique<optim::AdagradParamState>();
  s->step(r.ints[0]);
  s->sum(r.tensors[0]);
  return s;
}

template <typename T>
bool Is(const optim::Optimizer& o) {
  return dynamic_cast<const T*>(&o) != nullptr;
}

const std::vector<Codec>& Codecs() {
  using Adam = AdamLike<optim::AdamOptions, optim::AdamParamState>;
  using AdamW = AdamLike<optim::AdamWOptions, optim::AdamWParamState>;
  static const std::vector<Codec> codecs = {
      {"adam", &Is<optim::Adam>, &Adam::GetOptions, &Adam::SetOptions, 6, &Adam::GetState, &Adam::MakeState, 1, 3},
      {"adamw", &Is<optim::AdamW>, &AdamW::GetOptions, &AdamW::SetOptions, 6, &AdamW::GetState, &AdamW::MakeState,
       1, 3},
      {"sgd", &Is<optim::SGD>, &SgdOptions, &SetSgdOptions, 5, &SgdState, &MakeSgdState, 0, 1},
      {"rmsprop", &Is<optim::RMSprop>, &RmspropOptions, &SetRmspropOptions, 6, &RmspropState, &MakeRmspropState, 1,
       3},
      {"adagrad", &Is<optim::Adagrad>, &AdagradOptions, &SetAdagradOptions, 5, &AdagradState, &MakeAdagradState, 1,
       1},
  };
  return codecs;
}

const Codec* Find(const optim::Optimizer& optimizer) {
  for (const Codec& c : Codecs()) {
    if (c.matches(optimizer)) return &c;
  }
  return nullptr;
}

absl::Status Unsupported(const optim::Optimizer& optimizer) {
  return absl::UnimplementedError(absl::StrCat(
      "optimizer: ", typeid(optimizer).name(),
      " is not supported by elastic state sync (supported: Adam, AdamW, SGD, RMSprop, Adagrad)"));
}

std::string ShapeText(const at::Tensor& t) {
  if (!t.defined()) return "undefined";
  std::string s = c10::toString(t.scalar_type());
  absl::StrAppend(&s, "[");
  for (int64_t i = 0; i < t.dim(); ++i) absl::StrAppend(&s, i ? "," : "", t.size(i));
  absl::StrAppend(&s, "]");
  return s;
}

}  // namespace

std::string OptimizerKind(const torch::optim::Optimizer& optimizer) {
  const Codec* c = Find(optimizer);
  return c ? c->kind : "";
}

absl::Status PackOptimizer(const torch::optim::Optimizer& optimizer, RecordWriter& out) {
  const Codec* codec = Find(optimizer);
  if (codec == nullptr) return Unsupported(optimizer);
  out.PutString(codec->kind);
  const auto& groups = optimizer.param_groups();
  out.PutInt(static_cast<int64_t>(groups.size()));
  for (const optim::OptimizerParamGroup& group : groups) {
    for (double v : codec->get_options(group.options())) out.PutDouble(v);
    out.PutInt(static_cast<int64_t>(group.params().size()));
    for (const at::Tensor& p : group.params()) {
      auto it = optimizer.state().find(p.unsafeGetTensorImpl());
      if (it == optimizer.state().end() || !it->second) {
        out.PutInt(0);
        continue;
      }
      ParamRecord r = codec->get_state(*it->second);
      out.PutInt(1);
      for (int64_t v : r.ints) out.PutInt(v);
      for (const at::Tensor& t : r.tensors) out.PutTensor(t);
    }
  }
  return absl::OkStatus();
}

absl::Status UnpackOptimizer(RecordReader& in, torch::optim::Optimizer& optimizer) {
  const Codec* codec = Find(optimizer);
  if (codec == nullptr) return Unsupported(optimizer);
  MALLE_ASSIGN_OR_RETURN(std::string kind, in.String());
  if (kind != codec->kind) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer mismatch: the state source uses '", kind,
                                                   "', this rank '", codec->kind, "'"));
  }
  MALLE_ASSIGN_OR_RETURN(int64_t num_groups, in.Int());
  auto& groups = optimizer.param_groups();
  if (num_groups != static_cast<int64_t>(groups.size())) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer mismatch: the state source has ", num_groups,
                                                   " parameter groups, this rank ", groups.size()));
  }
  // Read and check everything before changing anything.
  std::vector<std::vector<double>> options(groups.size());
  std::vector<std::vector<ParamRecord>> records(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < codec->num_options; ++i) {
      MALLE_ASSIGN_OR_RETURN(double v, in.Double());
      options[g].push_back(v);
    }
    MALLE_ASSIGN_OR_RETURN(int64_t num_params, in.Int());
    const auto& params = groups[g].params();
    if (num_params != static_cast<int64_t>(params.size())) {
      return absl::InvalidArgumentError(absl::StrCat("optimizer mismatch: group ", g, " has ", num_params,
                                                     " parameters at the state source, ", params.size(),
                                                     " on this rank"));
    }
    for (size_t p = 0; p < params.size(); ++p) {
      ParamRecord r;
      MALLE_ASSIGN_OR_RETURN(int64_t present, in.Int());
      r.present = present != 0;
      if (r.present) {
        for (size_t i = 0; i < codec->num_ints; ++i) {
          MALLE_ASSIGN_OR_RETURN(int64_t v, in.Int());
          r.ints.push_back(v);
        }
        for (size_t i = 0; i < codec->num_tensors; ++i) {
          MALLE_ASSIGN_OR_RETURN(at::Tensor t, in.Tensor());
          if (t.defined() && (t.sizes() != params[p].sizes() || t.scalar_type() != params[p].scalar_type())) {
            return absl::InvalidArgumentError(absl::StrCat("optimizer mismatch: state of group ", g, " parameter ",
                                                           p, " is ", ShapeText(t), ", the parameter is ",
                                                           ShapeText(params[p])));
          }
          r.tensors.push_back(t);
        }
      }
      records[g].push_back(std::move(r));
    }
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    codec->set_options(groups[g].options(), options[g]);
    const auto& params = groups[g].params();
    for (size_t p = 0; p < params.size(); ++p) {
      void* key = params[p].unsafeGetTensorImpl();
      if (records[g][p].present) {
        auto state = codec->make_state(records[g][p]);
        optimizer.state()[key] = std::move(state);
      } else {
        optimizer.state().erase(key);
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<double>>> OptimizerOptions(const torch::optim::Optimizer& optimizer) {
  const Codec* codec = Find(optimizer);
  if (codec == nullptr) return Unsupported(optimizer);
  std::vector<std::vector<double>> out;
  for (const optim::OptimizerParamGroup& group : optimizer.param_groups()) {
    out.push_back(codec->get_options(group.options()));
  }
  return out;
}

absl::Status SetOptimizerOptions(torch::optim::Optimizer& optimizer, const std::vector<std::vector<double>>& options) {
  const Codec* codec = Find(optimizer);
  if (codec == nullptr) return Unsupported(optimizer);
  auto& groups = optimizer.param_groups();
  if (options.size() != groups.size()) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer mismatch: ", options.size(),
                                                   " groups of options for ", groups.size(), " groups"));
  }
  for (size_t g = 0; g < groups.size(); ++g) codec->set_options(groups[g].options(), options[g]);
  return absl::OkStatus();
}

absl::StatusOr<PartState> SaveOptimizer(const torch::optim::Optimizer& optimizer) {
  RecordWriter out;
  MALLE_RETURN_IF_ERROR(PackOptimizer(optimizer, out));
  return PartState{std::move(out.tensors()), std::move(out.bytes())};
}

absl::Status LoadOptimizer(PartState state, torch::optim::Optimizer& optimizer) {
  RecordReader in(state.bytes, std::move(state.tensors));
  MALLE_RETURN_IF_ERROR(UnpackOptimizer(in, optimizer));
  if (!in.done()) return absl::InvalidArgumentError("optimizer: trailing bytes after its state");
  return absl::OkStatus();
}

}  // namespace malle::elastic
