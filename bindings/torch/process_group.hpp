// process_group.hpp — dtrain's collectives behind PyTorch's c10d
// ProcessGroup interface (torch 1.13), so that
// torch.distributed.init_process_group("dtrain") runs DDP, FSDP-style
// collectives and user code on dtrain's shared-memory and TCP transports.
//
// How a torch call becomes dtrain calls:
//   1. The call is checked (CPU, dense, one of dtrain's 8 dtypes, a supported
//      reduction); anything else throws at once, naming the call and the
//      value, so nothing ever waits on an operation that cannot run.
//   2. Inputs that are not contiguous are copied into contiguous buffers;
//      list forms (all_gather into a list, reduce_scatter from a list, ...)
//      are packed into one flat buffer.
//   3. The non-blocking dtrain call (dt_group_iallreduce, ...) is issued on
//      the caller's thread, so operations keep the order torch issued them
//      in and dtrain's progress thread starts each at once (unless a thread
//      waits for it first: dt_work_wait then runs it on that thread).
//      Sends and receives between startCoalescing and endCoalescing
//      (batch_isend_irecv) are issued together as one dtrain batch.
//   4. A DtWork holds the dtrain handles, the borrowed buffers and a
//      finisher that copies results back where torch wants them. Whoever
//      first needs the result (wait(), is_completed(), the process group's
//      completion thread for get_future()) waits for the handles, runs the
//      finisher and completes the work and its future.
//
// Invariants: buffers passed to dtrain stay referenced by their work until
// the handles have been waited for; every issued handle is waited for
// exactly once (a work that is dropped unwaited waits in its destructor);
// operations on one process group are issued under one mutex, so an
// operation made of several dtrain calls is never interleaved with another.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/comm.h"

namespace dtrain_torch {

// The dtrain group behind a process group. Shared by the process group and
// its works, so that a work outliving its process group can still finish.
struct Comm {
    dt_group *g = nullptr;
    ~Comm() { dt_group_destroy(g); }
};

class DtWork;

// A dtrain operation some works wait for: one work usually, every
// transfer's work for a batch of sends and receives (one dtrain operation).
// Waited for once; its outcome is kept for the others.
class Handle {
  public:
    explicit Handle(dt_work *h) : h_(h) {}
    ~Handle() { wait(nullptr); }
    // Wait for the operation; DT_OK, or its status with the message in *why.
    dt_status wait(std::string *why);
    // Whether it completed; never blocks.
    bool done();

  private:
    std::mutex mu_;
    dt_work *h_; // NULL once waited for
    dt_status st_ = DT_OK;
    std::string why_;
};

// Completes, in issue order, the works whose futures were asked for (DDP's
// buckets, comm hooks): nothing else would complete a future nobody waits
// on through its work. Its state is shared with its thread, so the last
// reference to a process group may even be dropped on that thread.
class Completer {
  public:
    Completer();
    ~Completer(); // drains the queue, then stops the thread
    void push(c10::intrusive_ptr<DtWork> w);
    bool on_thread() const { return std::this_thread::get_id() == thread_.get_id(); }

  private:
    struct State {
        std::mutex mu;
        std::condition_variable cv;
        std::deque<c10::intrusive_ptr<DtWork>> queue;
        bool stop = false;
    };
    std::shared_ptr<State> state_;
    std::thread thread_;
};

class DtWork : public c10d::Work {
  public:
    DtWork(std::shared_ptr<Comm> comm, std::weak_ptr<Completer> completer, int rank,
           c10d::OpType type, const char *name, std::vector<at::Tensor> outputs);
    ~DtWork() override;

    void add(dt_work *h) { handles_.push_back(std::make_shared<Handle>(h)); }
    void add(std::shared_ptr<Handle> h) { handles_.push_back(std::move(h)); }
    // Keep t alive until the dtrain operations are done (they borrow it).
    void keep(const at::Tensor &t) { kept_.push_back(t); }
    // Complete with this error (an operation of it could not be issued).
    void fail(std::exception_ptr e) { error_ = std::move(e); }
    // Runs (in the order added) after the dtrain operations succeeded.
    void then(std::function<void()> f) { finishers_.push_back(std::move(f)); }
    const char *name() const { return name_; }

    bool isCompleted() override;
    bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
    std::vector<at::Tensor> result() override { return outputs_; }
    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

    // Wait for every handle, finish, complete the work and its future.
    // Idempotent, thread-safe, never throws (the error goes to the work).
    void complete();

  private:
    std::shared_ptr<Comm> comm_;
    std::weak_ptr<Completer> completer_;
    const char *name_;
    std::vector<std::shared_ptr<Handle>> handles_;
    std::vector<at::Tensor> kept_;
    std::vector<std::function<void()>> finishers_;
    std::exception_ptr error_; // set by fail()
    std::vector<at::Tensor> outputs_;
    c10::intrusive_ptr<c10::ivalue::Future> future_;
    std::mutex run_mu_; // one thread completes; the others wait for it
    bool done_ = false; // under run_mu_
};

class ProcessGroupDtrain : public c10d::ProcessGroup {
  public:
    // Collective over the ranks: they meet through `store` (rank 0 publishes
    // where its dtrain store listens and a fresh token) and build a dtrain
    // group. timeout_s <= 0 means DT_TIMEOUT (default 300 s).
    ProcessGroupDtrain(const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
                       double timeout_s);
    ~ProcessGroupDtrain() override;

    const std::string getBackendName() const override { return "dtrain"; }
    // "shm", "tcp", "shm+tcp" or "self".
    std::string transport() const { return dt_group_transport(comm_->g); }

    c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor> &tensors,
                                             const c10d::BroadcastOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor> &tensors,
                                             const c10d::AllreduceOptions &opts) override;
    c10::intrusive_ptr<c10d::Work>
    allreduce_coalesced(std::vector<at::Tensor> &tensors,
                        const c10d::AllreduceCoalescedOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor> &tensors,
                                          const c10d::ReduceOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>> &outputs,
                                             std::vector<at::Tensor> &inputs,
                                             const c10d::AllgatherOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor &output, at::Tensor &input,
                                                   const c10d::AllgatherOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>> &outputs,
                                          std::vector<at::Tensor> &inputs,
                                          const c10d::GatherOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor> &outputs,
                                           std::vector<std::vector<at::Tensor>> &inputs,
                                           const c10d::ScatterOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor> &outputs,
                                                  std::vector<std::vector<at::Tensor>> &inputs,
                                                  const c10d::ReduceScatterOptions &opts) override;
    c10::intrusive_ptr<c10d::Work>
    _reduce_scatter_base(at::Tensor &output, at::Tensor &input,
                         const c10d::ReduceScatterOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor &output, at::Tensor &input,
                                                 std::vector<int64_t> &outputSplits,
                                                 std::vector<int64_t> &inputSplits,
                                                 const c10d::AllToAllOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor> &outputs,
                                            std::vector<at::Tensor> &inputs,
                                            const c10d::AllToAllOptions &opts) override;
    c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor> &tensors, int dst,
                                        int tag) override;
    c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor> &tensors, int src,
                                        int tag) override;
    c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions &opts) override;

    // batch_isend_irecv: sends and receives between the two calls are held
    // back and issued at the end as one dtrain batch (all posted at once),
    // so a batch where every rank sends before it receives cannot deadlock
    // on messages too large for the transports' buffers.
    void startCoalescing() override;
    void endCoalescing(std::vector<c10::intrusive_ptr<c10d::Work>> &reqs) override;

  private:
    struct PendingP2P {
        bool is_send;
        at::Tensor buf;
        int peer, tag;
        c10::intrusive_ptr<DtWork> work;
    };

    c10::intrusive_ptr<DtWork> make_work(c10d::OpType type, const char *name,
                                         std::vector<at::Tensor> outputs);
    // Issue the held-back sends and receives as one batch; mu_ held.
    void flush_p2p();
    // The uneven all-to-all both alltoall forms reduce to: block j of `in`
    // (in_counts[j] elements at in_displs[j]) goes to rank j, block i of
    // `out` comes from rank i. mu_ held.
    void alltoallv(DtWork &w, const at::Tensor &in, const std::vector<int64_t> &in_counts,
                   const std::vector<int64_t> &in_displs, const at::Tensor &out,
                   const std::vector<int64_t> &out_counts, const std::vector<int64_t> &out_displs);

    std::shared_ptr<Comm> comm_;
    std::shared_ptr<Completer> completer_;
    std::mutex mu_; // issue order
    bool coalescing_ = false;
    std::vector<PendingP2P> pending_;
};

} // namespace dtrain_torch
