// dscpp::Engine, the public face of EngineImpl (engine_impl.h): the set-up is in setup.cpp, the
// step's order of events in step.cpp.
#include "dscpp/engine.h"

#include <ATen/ATen.h>

#include "dscpp/error.h"
#include "engine/engine_impl.h"
#include "util/log.h"

namespace dscpp {

Engine::Engine(std::shared_ptr<torch::nn::Module> model, Config config, InitOptions options)
    : impl_(std::make_unique<engine::EngineImpl>(std::move(model), std::move(config),
                                                 std::move(options))) {}
Engine::~Engine() = default;

void Engine::backward(const at::Tensor& loss) { impl_->backward(loss); }
void Engine::step() { impl_->step(); }
void Engine::flush_accumulation() { impl_->flush_accumulation(); }
std::string Engine::save_checkpoint(const std::string& dir, const std::string& tag,
                                    const nlohmann::json& client_state) {
  return impl_->save_checkpoint(dir, tag, client_state);
}
std::string Engine::wait_for_checkpoint() { return impl_->wait_for_checkpoint(); }
LoadResult Engine::load_checkpoint(const std::string& dir, const std::string& tag,
                                   const LoadOptions& options) {
  return impl_->load_checkpoint(dir, tag, options);
}
MemoryStats Engine::memory_stats() { return impl_->memory_stats(); }
int64_t Engine::skipped_steps() const { return impl_->skipped_steps_; }
double Engine::loss_scale() const { return impl_->loss_scale(); }
bool Engine::is_gradient_accumulation_boundary() const {
  return impl_->is_gradient_accumulation_boundary();
}
int64_t Engine::global_steps() const { return impl_->global_steps_; }
int64_t Engine::micro_steps() const { return impl_->micro_steps_; }
int64_t Engine::global_samples() const { return impl_->global_samples_; }
double Engine::get_lr() const { return impl_->get_lr(); }
int Engine::train_batch_size() const { return impl_->train_batch_size(); }
int Engine::train_micro_batch_size_per_gpu() const {
  return impl_->config_.batch.train_micro_batch_size_per_gpu;
}
int Engine::gradient_accumulation_steps() const { return impl_->gradient_accumulation_steps(); }
const StepStats& Engine::last_step() const { return impl_->last_step_; }
const Config& Engine::config() const { return impl_->config_; }
comm::Communicator& Engine::communicator() { return *impl_->comm_; }
int Engine::rank() const { return impl_->comm_->rank(); }
int Engine::world_size() const { return impl_->comm_->world_size(); }
torch::nn::Module& Engine::module() { return *impl_->model_; }
at::ScalarType Engine::dtype() const { return impl_->dtype(); }
at::Tensor Engine::cast_input(const at::Tensor& x) const {
  DSCPP_CHECK(x.defined(), Error, "cast_input() was given an undefined tensor");
  if (at::isFloatingType(x.scalar_type())) return x.to(impl_->device(), impl_->dtype());
  return x.to(impl_->device());
}
void Engine::set_tokens_per_sample(int64_t tokens) { impl_->tokens_per_sample_ = tokens; }

Engine::NoSync::NoSync(Engine& e) : engine_(e) { engine_.impl_->enter_no_sync(); }
Engine::NoSync::~NoSync() { engine_.impl_->leave_no_sync(); }

Engine::Autocast::Autocast(Engine& e) {
  engine::EngineImpl& impl = *e.impl_;
  if (impl.autocast_) {
    ++impl.autocast_scopes_;
    scope_ = std::make_unique<precision::AutocastScope>(*impl.autocast_);
    return;
  }
  precision::AutocastState off = precision::AutocastState::current();
  if (!off.any()) return;
  if (!impl.warned_outer_autocast_ && impl.comm_->rank() == 0) {
    DSCPP_LOG_WARN(
        "libtorch's autocast is on around engine->autocast() while torch_autocast is disabled: "
        "it is off inside, as in DeepSpeed (the bf16 / fp16 sections decide the precision). "
        "HINT: to train under autocast, enable the config's torch_autocast section");
  }
  impl.warned_outer_autocast_ = true;
  off.cpu = off.cuda = false;
  scope_ = std::make_unique<precision::AutocastScope>(off);
}
Engine::Autocast::~Autocast() = default;

std::shared_ptr<Engine> initialize(std::shared_ptr<torch::nn::Module> model,
                                   const std::string& config_path_or_json, InitOptions options) {
  return std::make_shared<Engine>(std::move(model), Config::parse(config_path_or_json),
                                  std::move(options));
}

}  // namespace dscpp
