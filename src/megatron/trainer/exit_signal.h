// ExitSignalHandler: Megatron's --exit-signal-handler. While it lives, --exit-signal (default SIGTERM) and
// SIGINT only set a flag; the training loop reads it after every iteration, agrees on it over the ranks (any
// rank's signal stops every rank), saves a checkpoint and leaves with status 0.
//
// The flag is the process's one global variable: a signal handler can reach nothing else. The handler does
// nothing but store it (async-signal-safe); SA_RESTART resumes interrupted system calls, and SA_RESETHAND
// restores the default action after the first signal, so a second one (a second Ctrl-C) ends the process at
// once. The previous handlers are restored on destruction. One handler at a time (the training loop's): a
// second would share the flag.
//
// Under mpirun, a signal sent to mpirun itself does not give the ranks this chance: Open MPI answers SIGTERM
// and SIGINT by killing the job (the ranks get SIGTERM, then SIGKILL a second later) and cannot forward them;
// it forwards SIGUSR1 and SIGUSR2. So signal the ranks themselves (as Slurm does), or use --exit-signal SIGUSR1
// and send that to mpirun (docs/observability.md).
#pragma once

#include <csignal>
#include <string>

namespace megatron::trainer {

class ExitSignalHandler {
 public:
  // `signal`: the exit signal's number (train::exit_signal_number).
  explicit ExitSignalHandler(int signal);
  ~ExitSignalHandler();
  ExitSignalHandler(const ExitSignalHandler&) = delete;
  ExitSignalHandler& operator=(const ExitSignalHandler&) = delete;

  // Whether this process has received the exit signal or SIGINT since the handler was installed.
  bool received() const;
  // The name of the signal received first ("SIGTERM"), or "" before any.
  std::string received_name() const;

 private:
  int signal_;
  struct sigaction previous_exit_{}, previous_interrupt_{};
};

}  // namespace megatron::trainer
