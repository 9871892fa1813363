#include "megatron/trainer/exit_signal.h"

#include <atomic>

#include "megatron/core/error.h"

namespace megatron::trainer {
namespace {

// The signal received first (0: none yet), set by the handler and read by the training loop. The one global of
// the project: a signal handler can reach nothing but globals. Lock-free, so storing it is async-signal-safe.
std::atomic<int> g_exit_signal_received{0};
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void on_exit_signal(int signal) {
  int none = 0;
  g_exit_signal_received.compare_exchange_strong(none, signal);
}

void install(int signal, struct sigaction& previous) {
  struct sigaction action{};
  action.sa_handler = on_exit_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART | SA_RESETHAND;
  MEGATRON_CHECK(sigaction(signal, &action, &previous) == 0, "--exit-signal-handler: cannot install a handler for ",
                 "signal ", signal);
}

}  // namespace

ExitSignalHandler::ExitSignalHandler(int signal) : signal_(signal) {
  g_exit_signal_received = 0;
  install(signal_, previous_exit_);
  if (signal_ != SIGINT) install(SIGINT, previous_interrupt_);
}

ExitSignalHandler::~ExitSignalHandler() {
  sigaction(signal_, &previous_exit_, nullptr);
  if (signal_ != SIGINT) sigaction(SIGINT, &previous_interrupt_, nullptr);
}

bool ExitSignalHandler::received() const { return g_exit_signal_received.load() != 0; }

std::string ExitSignalHandler::received_name() const {
  switch (g_exit_signal_received.load()) {
    case 0: return "";
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    case SIGHUP: return "SIGHUP";
    default: return str_cat("signal ", g_exit_signal_received.load());
  }
}

}  // namespace megatron::trainer
