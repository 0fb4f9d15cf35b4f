// process_group.cpp — ProcessGroupDtrain and its works (see the header for
// how a torch call becomes dtrain calls).
#include "process_group.hpp"

#include <Python.h>
#include <unistd.h>

#include <algorithm>
#include <random>
#include <stdexcept>
#include <tuple>

namespace dtrain_torch {

namespace {

// ---------------------------------------------------------------------------
// Checks and conversions
// ---------------------------------------------------------------------------

dt_dtype dtype_of(const at::Tensor &t, const char *op) {
    switch (t.scalar_type()) {
    case at::kFloat: return DT_F32;
    case at::kDouble: return DT_F64;
    case at::kHalf: return DT_F16;
    case at::kBFloat16: return DT_BF16;
    case at::kChar: return DT_I8;
    case at::kByte: return DT_U8;
    case at::kInt: return DT_I32;
    case at::kLong: return DT_I64;
    default:
        TORCH_CHECK(false, "dtrain ", op, ": dtype ", t.dtype(),
                    " is not supported (float32, float64, float16, bfloat16, int8, uint8, int32 "
                    "and int64 are)");
    }
}

dt_redop redop_of(const c10d::ReduceOp &op, const char *name) {
    switch (static_cast<c10d::ReduceOp::RedOpType>(op)) {
    case c10d::ReduceOp::SUM: return DT_SUM;
    case c10d::ReduceOp::AVG: return DT_AVG;
    case c10d::ReduceOp::PRODUCT: return DT_PROD;
    case c10d::ReduceOp::MIN: return DT_MIN;
    case c10d::ReduceOp::MAX: return DT_MAX;
    default: break;
    }
    static const char *const names[] = {"SUM",  "AVG", "PRODUCT", "MIN",       "MAX",
                                        "BAND", "BOR", "BXOR",    "PREMUL_SUM"};
    unsigned v = static_cast<c10d::ReduceOp::RedOpType>(op);
    TORCH_CHECK(false, "dtrain ", name, ": ReduceOp.", v < 9 ? names[v] : "?",
                " is not supported (SUM, AVG, PRODUCT, MIN and MAX are)");
}

void check_tensor(const at::Tensor &t, const char *op) {
    TORCH_CHECK(t.defined(), "dtrain ", op, ": undefined tensor");
    TORCH_CHECK(t.device().is_cpu(), "dtrain ", op, ": tensors must be on the CPU, got one on ",
                t.device());
    TORCH_CHECK(t.layout() == at::kStrided, "dtrain ", op,
                ": only dense tensors are supported, got ", t.layout());
    dtype_of(t, op);
}

const at::Tensor &single(const std::vector<at::Tensor> &ts, const char *op) {
    TORCH_CHECK(ts.size() == 1, "dtrain ", op, ": takes one tensor per process, got ", ts.size());
    check_tensor(ts[0], op);
    return ts[0];
}

// Tensors that must all have `like`'s dtype and number of elements.
void check_list(const std::vector<at::Tensor> &ts, size_t n, const at::Tensor &like,
                const char *what, const char *op) {
    TORCH_CHECK(ts.size() == n, "dtrain ", op, ": needs ", n, " ", what,
                " tensors (one per rank), got ", ts.size());
    for (size_t i = 0; i < ts.size(); i++) {
        check_tensor(ts[i], op);
        TORCH_CHECK(ts[i].scalar_type() == like.scalar_type() && ts[i].numel() == like.numel(),
                    "dtrain ", op, ": ", what, " tensor ", i, " has ", ts[i].numel(),
                    " elements of ", ts[i].dtype(), ", expected ", like.numel(), " of ",
                    like.dtype());
    }
}

void check_root(int root, int size, const char *op) {
    TORCH_CHECK(root >= 0 && root < size, "dtrain ", op, ": root ", root,
                " is not a rank of a group of ", size);
}

// The tensor itself when dtrain can use its memory as it is, else a
// contiguous copy (results are copied back by the work's finisher).
at::Tensor dense(const at::Tensor &t) { return t.is_contiguous() ? t : t.contiguous(); }

// The tensors' elements one after another in one new buffer.
at::Tensor pack(const std::vector<at::Tensor> &ts) {
    std::vector<at::Tensor> flat;
    flat.reserve(ts.size());
    for (const auto &t : ts)
        flat.push_back(t.reshape({-1}));
    return at::cat(flat);
}

// Copy consecutive pieces of `flat` into `ts` (the inverse of pack).
void unpack(const at::Tensor &flat, const std::vector<at::Tensor> &ts) {
    int64_t off = 0;
    for (const auto &t : ts) {
        t.copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
        off += t.numel();
    }
}

size_t count(const at::Tensor &t) { return static_cast<size_t>(t.numel()); }

// all_gather into a list broadcasts each block into place from this many
// bytes per rank (measured at 2 and 4 ranks: below it one allgather into a
// flat buffer and copies out are faster, above it the broadcasts).
constexpr int64_t kGatherByBroadcast = 256 << 10;

void check_issue(dt_status st, const char *op) {
    if (st != DT_OK)
        throw std::runtime_error(c10::str("dtrain ", op, ": ", dt_last_error()));
}

// ---------------------------------------------------------------------------
// Rendezvous through the c10d store
// ---------------------------------------------------------------------------

std::string get_str(c10d::Store &store, const std::string &key) {
    auto v = store.get(key);
    return std::string(v.begin(), v.end());
}

void set_str(c10d::Store &store, const std::string &key, const std::string &val) {
    store.set(key, std::vector<uint8_t>(val.begin(), val.end()));
}

std::string host_name() {
    char h[256] = {0};
    gethostname(h, sizeof h - 1);
    return h;
}

std::string random_token() {
    std::random_device rd; // /dev/urandom
    static const char hex[] = "0123456789abcdef";
    std::string t;
    for (int i = 0; i < 32; i++)
        t += hex[rd() & 15];
    return t;
}

struct Meeting {
    c10d::Store *store;
    std::string key, addr, token;
};

// on_listen of rank 0: where its dtrain store listens, for the others.
dt_status publish(void *arg, int port) {
    auto *m = static_cast<Meeting *>(arg);
    try {
        set_str(*m->store, m->key, c10::str(m->addr, " ", port, " ", m->token));
        return DT_OK;
    } catch (const std::exception &e) {
        return dt_error_set(
            DT_ERR_IO, "cannot publish the dtrain store's address in the c10d store: %s", e.what());
    }
}

} // namespace

// ---------------------------------------------------------------------------
// Completer
// ---------------------------------------------------------------------------

Completer::Completer() : state_(std::make_shared<State>()) {
    thread_ = std::thread([s = state_] {
        pthread_setname_np(pthread_self(), "dtrain-futures");
        for (;;) {
            c10::intrusive_ptr<DtWork> w;
            {
                std::unique_lock<std::mutex> lock(s->mu);
                s->cv.wait(lock, [&] { return s->stop || !s->queue.empty(); });
                if (s->queue.empty())
                    return;
                w = std::move(s->queue.front());
                s->queue.pop_front();
            }
            // Dropping w may drop the last reference to the process group,
            // whose destructor then detaches this thread: touch only `s`.
            w->complete();
        }
    });
}

Completer::~Completer() {
    {
        std::lock_guard<std::mutex> lock(state_->mu);
        state_->stop = true;
    }
    state_->cv.notify_all();
    if (on_thread())
        thread_.detach();
    else
        thread_.join();
}

void Completer::push(c10::intrusive_ptr<DtWork> w) {
    {
        std::lock_guard<std::mutex> lock(state_->mu);
        state_->queue.push_back(std::move(w));
    }
    state_->cv.notify_one();
}

// ---------------------------------------------------------------------------
// Handle
// ---------------------------------------------------------------------------

dt_status Handle::wait(std::string *why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (h_) {
        st_ = dt_work_wait(h_);
        if (st_ != DT_OK)
            why_ = dt_last_error();
        h_ = nullptr;
    }
    if (why && st_ != DT_OK)
        *why = why_;
    return st_;
}

bool Handle::done() {
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (!lock.owns_lock())
        return false; // another thread is waiting for it
    bool d = true;
    return !h_ || (dt_work_test(h_, &d) == DT_OK && d);
}

// ---------------------------------------------------------------------------
// DtWork
// ---------------------------------------------------------------------------

DtWork::DtWork(std::shared_ptr<Comm> comm, std::weak_ptr<Completer> completer, int rank,
               c10d::OpType type, const char *name, std::vector<at::Tensor> outputs)
    : c10d::Work(rank, type, name), comm_(std::move(comm)), completer_(std::move(completer)),
      name_(name), outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors())) {}

DtWork::~DtWork() { complete(); }

void DtWork::complete() {
    std::exception_ptr err;
    {
        std::lock_guard<std::mutex> lock(run_mu_);
        if (done_)
            return;
        std::string why;
        err = error_;
        for (auto &h : handles_)
            if (h->wait(&why) != DT_OK)
                break; // the group is failed: the later ones fail alike
        handles_.clear();
        if (!why.empty() && !err)
            err = std::make_exception_ptr(std::runtime_error(c10::str(name_, " failed: ", why)));
        for (auto &f : finishers_) {
            if (err)
                break;
            try {
                f();
            } catch (...) {
                err = std::current_exception();
            }
        }
        finishers_.clear();
        kept_.clear();
        done_ = true;
        finish(err);
    }
    // Outside run_mu_: the future's callbacks (DDP, comm hooks) may issue
    // and wait for more work, this one included.
    if (err)
        future_->setError(err);
    else
        future_->markCompleted(c10::IValue(outputs_));
}

bool DtWork::isCompleted() {
    {
        std::unique_lock<std::mutex> lock(run_mu_, std::try_to_lock);
        if (!lock.owns_lock())
            return false; // another thread is completing it
        for (auto &h : handles_)
            if (!h->done())
                return false;
    }
    complete(); // every handle is done: this does not block
    return true;
}

bool DtWork::wait(std::chrono::milliseconds timeout) {
    if (timeout == kNoTimeout) {
        complete();
    } else {
        // dtrain bounds every wait by DT_TIMEOUT; a shorter bound asked for
        // here is the caller's, and the work stays pending when it expires.
        auto until = std::chrono::steady_clock::now() + timeout;
        while (!isCompleted()) {
            TORCH_CHECK(std::chrono::steady_clock::now() < until, name_, ": not completed within ",
                        timeout.count(), " ms");
            std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (exception_)
        std::rethrow_exception(exception_);
    return true;
}

c10::intrusive_ptr<c10::ivalue::Future> DtWork::getFuture() {
    auto completer = completer_.lock();
    // A future callback that issues work and waits on its future runs on
    // the completer's thread, which would then wait for itself: complete
    // such a work here. Without a process group there is no completer.
    if (!completer || completer->on_thread())
        complete();
    else
        completer->push(c10::intrusive_ptr<DtWork>::unsafe_reclaim_from_nonowning(this));
    return future_;
}

// ---------------------------------------------------------------------------
// ProcessGroupDtrain
// ---------------------------------------------------------------------------

ProcessGroupDtrain::ProcessGroupDtrain(const c10::intrusive_ptr<c10d::Store> &store, int rank,
                                       int size, double timeout_s)
    : c10d::ProcessGroup(rank, size), comm_(std::make_shared<Comm>()),
      completer_(std::make_shared<Completer>()) {
    const char *be = getenv("DT_BACKEND");
    TORCH_CHECK(!(be && *be && std::string(be) != "native"), "dtrain: DT_BACKEND=", be,
                " is not supported by the PyTorch backend (it runs dtrain's own transports; "
                "unset DT_BACKEND)");
    // A store may serve several process groups in turn (env:// reuses its
    // TCPStore): each creation counts itself, and its keys carry the count.
    int64_t ticket = store->add("dtrain/joined", 1);
    std::string gen = std::to_string((ticket - 1) / size);
    set_str(*store, c10::str("dtrain/", gen, "/host/", rank), host_name());

    Meeting m{store.get(), c10::str("dtrain/", gen, "/meet"), "", ""};
    dt_group_options o{};
    o.rank = rank;
    o.size = size;
    o.job_id = "torch";
    o.timeout = timeout_s;
    if (rank == 0) {
        // Rank 0's store is reached at 127.0.0.1 when every rank is on this
        // host, else at DT_IFADDR or this host's name.
        bool one_host = true;
        std::string me = host_name();
        for (int r = 1; r < size; r++)
            one_host = one_host && get_str(*store, c10::str("dtrain/", gen, "/host/", r)) == me;
        const char *ifaddr = getenv("DT_IFADDR");
        m.addr = one_host ? "127.0.0.1" : ifaddr && *ifaddr ? ifaddr : me;
        m.token = random_token();
        o.master_port = 0; // any free port, published by on_listen
        o.on_listen = publish;
        o.on_listen_arg = &m;
    } else {
        std::string v = get_str(*store, m.key);
        size_t a = v.find(' '), b = v.rfind(' ');
        TORCH_CHECK(a != std::string::npos && b > a, "dtrain: bad meeting record \"", v,
                    "\" in the store");
        m.addr = v.substr(0, a);
        o.master_port = std::stoi(v.substr(a + 1, b - a - 1));
        m.token = v.substr(b + 1);
    }
    o.master_addr = m.addr.c_str();
    o.token = m.token.c_str();
    if (dt_group_init(&comm_->g, &o) != DT_OK)
        throw std::runtime_error(c10::str("dtrain: creating the process group (rank ", rank, " of ",
                                          size, "): ", dt_last_error()));
    init();
}

ProcessGroupDtrain::~ProcessGroupDtrain() {
    try { // a batch never ended: issue it, its works are out there
        std::lock_guard<std::mutex> lock(mu_);
        flush_p2p();
    } catch (const std::exception &) { // its works have failed with the error
    }
    // Python may drop the last reference with the GIL held while a future
    // callback on the completer's thread waits for the GIL: let it go while
    // the completer drains.
    PyThreadState *ts = Py_IsInitialized() && PyGILState_Check() ? PyEval_SaveThread() : nullptr;
    completer_.reset();
    if (ts)
        PyEval_RestoreThread(ts);
}

c10::intrusive_ptr<DtWork> ProcessGroupDtrain::make_work(c10d::OpType type, const char *name,
                                                         std::vector<at::Tensor> outputs) {
    return c10::make_intrusive<DtWork>(comm_, completer_, rank_, type, name, std::move(outputs));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::broadcast(std::vector<at::Tensor> &tensors,
                                                             const c10d::BroadcastOptions &opts) {
    static const char *op = "broadcast";
    const at::Tensor &t = single(tensors, op);
    check_root(opts.rootRank, size_, op);
    TORCH_CHECK(opts.rootTensor == 0, "dtrain broadcast: rootTensor must be 0, got ",
                opts.rootTensor);
    std::lock_guard<std::mutex> lock(mu_);
    flush_p2p();
    auto w = make_work(c10d::OpType::BROADCAST, "dtrain:broadcast", tensors);
    at::Tensor buf = dense(t);
    dt_work *h;
    check_issue(dt_group_ibroadcast(comm_->g, buf.data_ptr(), count(buf), dtype_of(t, op),
                                    opts.rootRank, &h),
                op);
    w->add(h);
    w->keep(buf);
    if (!buf.is_same(t) && rank_ != opts.rootRank)
        w->then([t, buf] { t.copy_(buf); });
    return w;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::allreduce(std::vector<at::Tensor> &tensors,
                                                             const c10d::AllreduceOptions &opts) {
    static const char *op = "all_reduce";
    const at::Tensor &t = single(tensors, op);
    dt_redop rop = redop_of(opts.reduceOp, op);
    std::lock_guard<std::mutex> lock(mu_);
    flush_p2p();
    auto w = make_work(c10d::OpType::ALLREDUCE, "dtrain:all_reduce", tensors);
    at::Tensor buf = dense(t);
    dt_work *h;
    check_issue(dt_group_iallreduce(comm_->g, buf.data_ptr(), buf.data_ptr(), count(buf),
                                    dtype_of(t, op), rop, &h),
                op);
    w->add(h);
    w->keep(buf);
    if (!buf.is_same(t))
        w->then([t, buf] { t.copy_(buf); });
    return w;
}

c10::intrusive_ptr<c10d::Work>
ProcessGroupDtrain::allreduce_coalesced(std::vector<at::Tensor> &tensors,
                                        const c10d::AllreduceCoalescedOptions &opts) {
    static const char *op = "all_reduce_coalesced";
    TORCH_CHECK(!tensors.empty(), "dtrain ", op, ": no tensors");
    for (const auto &t : tensors) {
        check_tensor(t, op);
        TORCH_CHECK(t.scalar_type() == tensors[0].scalar_type(), "dtrain ", op,
                    ": tensors must share one dtype, got ", tensors[0].dtype(), " and ", t.dtype());
    }
    dt_redop rop = redop_of(opts.reduceOp, op);
    std::lock_guard<std::mutex> lock(mu_);
    flush_p2p();
    auto w = make_work(c10d::OpType::ALLREDUCE_COALESCED, "dtrain:all_reduce_coalesced", tensors);
    at::Tensor flat = pack(tensors);
    dt_work *h;
    check_issue(dt_group_iallreduce(comm_->g, flat.data_ptr(), flat.data_ptr(), count(flat),
                                    dtype_of(flat, op), rop, &h),
                op);
    w->add(h);
    w->keep(flat);
    w->then([flat, tensors] { unpack(flat, tensors); });
    return w;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::reduce(std::vector<at::Tensor> &tensors,
                                                          const c10d::ReduceOptions &opts) {
    static const char *op = "reduce";
    const at::Tensor &t = single(tensors, op);
    check_root(opts.rootRank, size_, op);
    dt_redop rop = redop_of(opts.reduceOp, op);
    std::lock_guard<std::mutex> lock(mu_);
    flush_p2p();
    auto w = make_work(c10d::OpType::REDUCE, "dtrain:reduce", tensors);
    at::Tensor buf = dense(t);
    bool root = rank_ == opts.rootRank;
    dt_work *h;
    // Only the root's tensor changes (gloo leaves partial sums elsewhere).
    check_issue(dt_group_ireduce(comm_->g, buf.data_ptr(), root ? buf.data_ptr() : nullptr,
                                 count(buf), dtype_of(t, op), rop, opts.rootRank, &h),
                op);
    w->add(h);
    w->keep(buf);
    if (root && !buf.is_same(t))
        w->then([t, buf] { t.copy_(buf); });
    return w;
}

c10::intrusive_ptr<c10d::Work>
ProcessGroupDtrain::allgather(std::vector<std::vector<at::Tensor>> &outputs,
                              std::vector<at::Tensor> &inputs, const c10d::AllgatherOptions &) {
    static const char *op = "all_gather";
    const at::Tensor &in = single(inputs, op);
    TORCH_CHECK(outputs.size() == 1, "dtrain all_gather: takes one output list per process, got ",
                outputs.size());
    const std::vector<at::Tensor> &outs = outputs[0];
    check_list(outs, size_, in, "output", op);
    std::lock_guard<std::mutex> lock(mu_);
    flush_p2p();
    auto w = make_work(c10d::OpType::ALLGATHER, "dtrain:all_gather", outs);
    bool dense_outs = std::all_of(outs.begin(), outs.end(),
                                  [](const at::Tensor &o) { return o.is_contiguous(); });
    if (dense_outs && in.numel() * in.element_size() >= kGatherByBroadcast) {
        // Large blocks: each rank broadcasts its block straight into every
        // rank's output. The flat buffer of the other path costs fresh
        // pages on every call (glibc maps blocks this large anew) and a
        // copy out of it: 16 MiB per rank at 2 ranks took 23 ms that way,
        // two 16 MiB broadcasts take under 2.
        outs[rank_].copy_(in);
        for (int r = 0; r < size_; r++) {
            dt_work *h;
            check_issue(dt_group_ibroadcast(comm_->g, outs[r].data_ptr(), count(in),
                                            dtype_of(in, op), r, &h),
                        op);
            w->add(h);
        }
        for (const auto &o : outs)
            w->keep(o);
        return w;
    }
    at::Tensor buf = dense(in);
    at::Tensor flat = at::empty({size_ * in.numel()}, in.options());
    dt_work *h;
    check_issue(dt_group_iallgather(comm_->g, buf.data_ptr(), flat.data_ptr(), count(in),
                                    dtype_of(in, op), &h),
                op);
    w->add(h);
    w->keep(buf);
    w->keep(flat);
    w->then([flat, outs] { unpack(flat, outs); });
    return w;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::_allgather_base(at::Tensor &output,
                                                                   at::Tensor &input,
                                                                   const c10d::AllgatherOptions &) {
    static const char *op = "all_gather_into_tensor";
    check_tensor(output, op);
    check_tensor(input, op);
    TORCH_CHECK(output.scalar_type() == input.scalar_type() &&
                    output.numel() == size_ * input.numel(),
                "dtrain ", op, ": the output must hold ", size_, " x ", input.numel(),
                " elements of ", input.dtype(), ", got ", output.numel(), " of ", output.dtype());
    std::lock_guard<std::mutex> lock(mu_);
    flush_p2p();
    auto w = make_work(c10d::OpType::_ALLGATHER_BASE, "dtrain:all_gather_into_tensor", {output});
    at::Tensor obuf = dense(output);
    size_t k = count(input), esz = input.element_size();
    // In place (FSDP's layout): the input is this rank's block of the output.
    bool in_place = obuf.is_same(output) && input.is_contiguous() && k > 0 &&
                    input.data_ptr() == static_cast<char *>(obuf.data_ptr()) + rank_ * k * esz;
    at::Tensor ibuf = in_place ? obuf : dense(input);
    if (!in_place && ibuf.is_alias_of(obuf))
        ibuf = ibuf.clone();
    dt_work *h;
    check_issue(
        dt_group_iallgather(comm_->g, ibuf.data_ptr(), obuf.data_ptr(), k, dtype_of(input, op), &h),
        op);
    w->add(h);
    w->keep(ibuf);
    w->keep(obuf);
    if (!obuf.is_same(output))
        w->then([output, obuf] { output.copy_(obuf); });
    return w;
}

c10::intrusive_ptr<c10d::Work>
ProcessGroupDtrain::gather(std::vector<std::vector<at::Tensor>> &outputs,
                           std::vector<at::Tensor> &inputs, const c10d::GatherOptions &opts) {
    static const char *op = "gather";
    const at::Tensor &in = single(inputs, op);
    check_root(opts.rootRank, size_, op);
    bool root = rank_ == opts.rootRank;
    if (root) {
        TORCH_CHECK(outputs.size() == 1, "dtrain gather: the root takes one output list, got ",
                    outputs.size());
    } else {
        TORCH_CHECK(outputs.empty(), "dtrain gather: only the root (rank ", opts.rootRank,
                    ") takes outputs");
    }
    std::vector<at::Tensor> outs = root ? outputs[0] : std::vector<at::Tensor>{};
    if (root)
        check_list(outs, size_, in, "output", op);
    std::lock_guard<std::mutex> lock(mu_);
    flush_p2p();
    auto w = make_work(c10d::OpType::GATHER, "dtrain:gather", outs);
    at::Tensor buf = dense(in);
    at::Tensor flat = root ? at::empty({size_ * in.numel()}, in.options()) : at::Tensor();
    dt_work *h;
    check_issue(dt_group_igather(comm_->g, buf.data_ptr(), root ? flat.data_ptr() : nullptr,
                                 count(in), dtype_of(in, op), opts.rootRank, &h),
                op);
    w->add(h);
    w->keep(buf);
    if (root) {
        w->keep(flat);
        w->then([flat, outs] { unpack(flat, outs); });
    }
    return w;
}

c10::intrusive_ptr<c10d::Work>
ProcessGroupDtrain::scatter(std::vector<at::Tensor> &outputs,
                            std::vector<std::vector<at::Tensor>> &inputs,
                            const c10d::ScatterOptions &opts) {
    static const char *op = "scatter";
    const at::Tensor &out = single(outputs, op);
    check_root(opts.rootRank, size_, op);
    bool root = rank_ == opts.rootRank;
    if (root) {
        TORCH_CHECK(inputs.size() == 1, "dtrain scatter: the root takes one input list, got ",
                    inputs.size());
        check_list(inputs[0], size_, out, "input", op);
    } else {
        TORCH_CHECK(inputs.empty(), "dtrain scatter: only the root (rank ", opts.rootRank,
                    ") takes inputs");
    }
    std::lock_guard<std::mutex> lock(mu_);
    flush_p2p();
    auto w = make_work(c10d::OpType::SCATTER, "dtrain:scatter", outputs);
    at::Tensor flat = root ? pack(inputs[0]) : at::Tensor();
    at::Tensor obuf = dense(out);
    dt_work *h;
    check_issue(dt_group_iscatter(comm_->g, root ? flat.data_ptr() : nullptr, obuf.data_ptr(),
                                  count(out), dtype_of(out, op), opts.rootRank, &h),
                op);
    w->add(h);
    w->keep(obuf);
    if (root)
        w->keep(flat);
    if (!obuf.is_same(out))
        w->then([out, obuf] { out.copy_(obuf); });
    return w;
}

c10::intrusive_ptr<c10d::Work>
ProcessGroupDtrain::reduce_scatter(std::vector<at::Tensor> &outputs,
                                   std::vector<std::vector<at::Tensor>> &inputs,
                                   const c10d::ReduceScatterOptions &opts) {
    static const char *op = "reduce_scatter";
    const at::Tensor &out = single(outputs, op);
    TORCH_CHECK(inputs.size() == 1, "dtrain reduce_scatter: takes one input list per process, got ",
                inputs.size());
    check_list(inputs[0], size_, out, "input", op);
    dt_redop rop = redop_of(opts.reduceOp, op);
    std::lock_guard<std::mutex> lock(mu_);
    flush_p2p();
    auto w = make_work(c10d::OpType::REDUCE_SCATTER, "dtrain:reduce_scatter", outputs);
    at::Tensor flat = pack(inputs[0]);
    at::Tensor obuf = dense(out);
    dt_work *h;
    check_issue(dt_group_ireduce_scatter(comm_->g, flat.data_ptr(), obuf.data_ptr(), count(out),
                                         dtype_of(out, op), rop, &h),
                op);
    w->add(h);
    w->keep(flat);
    w->keep(obuf);
    if (!obuf.is_same(out))
        w->then([out, obuf] { out.copy_(obuf); });
    return w;
}

c10::intrusive_ptr<c10d::Work>
ProcessGroupDtrain::_reduce_scatter_base(at::Tensor &output, at::Tensor &input,
                                         const c10d::ReduceScatterOptions &opts) {
    static const char *op = "reduce_scatter_tensor";
    check_tensor(output, op);
    check_tensor(input, op);
    TORCH_CHECK(output.scalar_type() == input.scalar_type() &&
                    input.numel() == size_ * output.numel(),
                "dtrain ", op, ": the input must hold ", size_, " x ", output.numel(),
                " elements of ", output.dtype(), ", got ", input.numel(), " of ", input.dtype());
    dt_redop rop = redop_of(opts.reduceOp, op);
    std::lock_guard<std::mutex> lock(mu_);
    flush_p2p();
    auto w =
        make_work(c10d::OpType::_REDUCE_SCATTER_BASE, "dtrain:reduce_scatter_tensor", {output});
    at::Tensor obuf = dense(output);
    at::Tensor ibuf = dense(input);
    if (ibuf.is_alias_of(obuf))
        ibuf = ibuf.clone(); // dtrain's in-place layout is not torch's
    dt_work *h;
    check_issue(dt_group_ireduce_scatter(comm_->g, ibuf.data_ptr(), obuf.data_ptr(), count(output),
                                         dtype_of(output, op), rop, &h),
                op);
    w->add(h);
    w->keep(ibuf);
    w->keep(obuf);
    if (!obuf.is_same(output))
        w->then([output, obuf] { output.copy_(obuf); });
    return w;
}

void ProcessGroupDtrain::alltoallv(DtWork &w, const at::Tensor &in,
                                   const std::vector<int64_t> &in_counts,
                                   const std::vector<int64_t> &in_displs, const at::Tensor &out,
                                   const std::vector<int64_t> &out_counts,
                                   const std::vector<int64_t> &out_displs) {
    // dtrain's alltoall moves equal blocks: every block is padded to the
    // largest one any rank sends, which one small allreduce finds out.
    int64_t mine = 0, block = 0;
    for (int r = 0; r < size_; r++)
        mine = std::max({mine, in_counts[r], out_counts[r]});
    check_issue(dt_group_allreduce(comm_->g, &mine, &block, 1, DT_I64, DT_MAX), w.name());
    if (block == 0)
        return;
    at::Tensor src = in.reshape({-1});
    at::Tensor send = at::empty({size_ * block}, in.options());
    at::Tensor recv = at::empty({size_ * block}, in.options());
    for (int r = 0; r < size_; r++)
        send.narrow(0, r * block, in_counts[r]).copy_(src.narrow(0, in_displs[r], in_counts[r]));
    dt_work *h;
    check_issue(dt_group_ialltoall(comm_->g, send.data_ptr(), recv.data_ptr(),
                                   static_cast<size_t>(block), dtype_of(in, w.name()), &h),
                w.name());
    w.add(h);
    w.keep(send);
    w.keep(recv);
    int n = size_;
    w.then([recv, out, out_counts, out_displs, block, n] {
        at::Tensor dst =
            out.is_contiguous() ? out.view({-1}) : at::empty({out.numel()}, out.options());
        for (int r = 0; r < n; r++)
            dst.narrow(0, out_displs[r], out_counts[r])
                .copy_(recv.narrow(0, r * block, out_counts[r]));
        if (!out.is_contiguous())
            out.copy_(dst.view(out.sizes()));
    });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::alltoall_base(at::Tensor &output,
                                                                 at::Tensor &input,
                                                                 std::vector<int64_t> &outputSplits,
                                                                 std::vector<int64_t> &inputSplits,
                                                                 const c10d::AllToAllOptions &) {
    static const char *op = "all_to_all_single";
    check_tensor(output, op);
    check_tensor(input, op);
    TORCH_CHECK(output.scalar_type() == input.scalar_type(), "dtrain ", op,
                ": input and output dtypes differ: ", input.dtype(), " and ", output.dtype());
    std::lock_guard<std::mutex> lock(mu_);
    flush_p2p();
    auto w = make_work(c10d::OpType::ALLTOALL_BASE, "dtrain:all_to_all_single", {output});
    if (outputSplits.empty() && inputSplits.empty()) {
        TORCH_CHECK(input.numel() == output.numel() && input.numel() % size_ == 0, "dtrain ", op,
                    ": without splits, input and output must hold the same multiple of ", size_,
                    " elements, got ", input.numel(), " and ", output.numel());
        at::Tensor obuf = dense(output);
        at::Tensor ibuf = dense(input);
        if (!ibuf.is_same(obuf) && ibuf.is_alias_of(obuf))
            ibuf = ibuf.clone();
        dt_work *h;
        check_issue(dt_group_ialltoall(comm_->g, ibuf.data_ptr(), obuf.data_ptr(),
                                       count(input) / size_, dtype_of(input, op), &h),
                    op);
        w->add(h);
        w->keep(ibuf);
        w->keep(obuf);
        if (!obuf.is_same(output))
            w->then([output, obuf] { output.copy_(obuf); });
        return w;
    }
    // Splits count rows (slices along dim 0); no split list means equal ones.
    auto rows = [&](const at::Tensor &t, std::vector<int64_t> splits, const char *what) {
        TORCH_CHECK(t.dim() >= 1, "dtrain ", op, ": the ", what, " needs a dimension to split");
        int64_t n = t.size(0), row = n ? t.numel() / n : 0;
        if (splits.empty()) {
            TORCH_CHECK(n % size_ == 0, "dtrain ", op, ": ", n, " ", what,
                        " rows do not split evenly over ", size_, " ranks");
            splits.assign(size_, n / size_);
        }
        TORCH_CHECK(static_cast<int>(splits.size()) == size_, "dtrain ", op, ": ", what,
                    " splits have ", splits.size(), " entries for ", size_, " ranks");
        int64_t sum = 0;
        for (int64_t s : splits) {
            TORCH_CHECK(s >= 0, "dtrain ", op, ": negative ", what, " split ", s);
            sum += s;
        }
        TORCH_CHECK(sum == n, "dtrain ", op, ": ", what, " splits add up to ", sum, " rows, the ",
                    what, " has ", n);
        std::vector<int64_t> counts(size_), displs(size_);
        for (int r = 0, off = 0; r < size_; off += splits[r] * row, r++) {
            counts[r] = splits[r] * row;
            displs[r] = off;
        }
        return std::make_tuple(counts, displs, row);
    };
    auto [ic, id, irow] = rows(input, inputSplits, "input");
    auto [oc, od, orow] = rows(output, outputSplits, "output");
    TORCH_CHECK(irow == orow || input.numel() == 0 || output.numel() == 0, "dtrain ", op,
                ": input rows have ", irow, " elements, output rows ", orow);
    alltoallv(*w, input, ic, id, output, oc, od);
    return w;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::alltoall(std::vector<at::Tensor> &outputs,
                                                            std::vector<at::Tensor> &inputs,
                                                            const c10d::AllToAllOptions &) {
    static const char *op = "all_to_all";
    TORCH_CHECK(inputs.size() == static_cast<size_t>(size_) &&
                    outputs.size() == static_cast<size_t>(size_),
                "dtrain ", op, ": needs ", size_, " input and output tensors, got ", inputs.size(),
                " and ", outputs.size());
    for (int r = 0; r < size_; r++) {
        check_tensor(inputs[r], op);
        check_tensor(outputs[r], op);
        TORCH_CHECK(inputs[r].scalar_type() == inputs[0].scalar_type() &&
                        outputs[r].scalar_type() == inputs[0].scalar_type(),
                    "dtrain ", op, ": tensors must share one dtype, got ", inputs[0].dtype(), ", ",
                    inputs[r].dtype(), " and ", outputs[r].dtype());
    }
    std::vector<int64_t> ic(size_), id(size_), oc(size_), od(size_);
    for (int r = 0; r < size_; r++) {
        ic[r] = inputs[r].numel();
        oc[r] = outputs[r].numel();
        id[r] = r ? id[r - 1] + ic[r - 1] : 0;
        od[r] = r ? od[r - 1] + oc[r - 1] : 0;
    }
    std::lock_guard<std::mutex> lock(mu_);
    flush_p2p();
    auto w = make_work(c10d::OpType::ALLTOALL, "dtrain:all_to_all", outputs);
    at::Tensor in = pack(inputs);
    at::Tensor out = at::empty({od[size_ - 1] + oc[size_ - 1]}, in.options());
    alltoallv(*w, in, ic, id, out, oc, od);
    w->then([out, outputs] { unpack(out, outputs); });
    return w;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::barrier(const c10d::BarrierOptions &) {
    std::lock_guard<std::mutex> lock(mu_);
    flush_p2p();
    auto w = make_work(c10d::OpType::BARRIER, "dtrain:barrier", {});
    dt_work *h;
    check_issue(dt_group_ibarrier(comm_->g, &h), "barrier");
    w->add(h);
    return w;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::send(std::vector<at::Tensor> &tensors, int dst,
                                                        int tag) {
    const at::Tensor &t = single(tensors, "send");
    TORCH_CHECK(dst >= 0 && dst < size_ && dst != rank_, "dtrain send: destination ", dst,
                " is not another rank of a group of ", size_);
    std::lock_guard<std::mutex> lock(mu_);
    PendingP2P p{true, dense(t), dst, tag, make_work(c10d::OpType::SEND, "dtrain:send", tensors)};
    pending_.push_back(p);
    if (!coalescing_)
        flush_p2p();
    return p.work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDtrain::recv(std::vector<at::Tensor> &tensors, int src,
                                                        int tag) {
    const at::Tensor &t = single(tensors, "recv");
    TORCH_CHECK(src >= 0 && src < size_ && src != rank_, "dtrain recv: source ", src,
                " is not another rank of a group of ", size_);
    std::lock_guard<std::mutex> lock(mu_);
    PendingP2P p{false, dense(t), src, tag, make_work(c10d::OpType::RECV, "dtrain:recv", tensors)};
    if (!p.buf.is_same(t))
        p.work->then([t, buf = p.buf] { t.copy_(buf); });
    pending_.push_back(p);
    if (!coalescing_)
        flush_p2p();
    return p.work;
}

void ProcessGroupDtrain::flush_p2p() {
    if (pending_.empty())
        return;
    std::vector<PendingP2P> batch;
    batch.swap(pending_);
    std::vector<dt_p2p> ops;
    for (const auto &p : batch)
        ops.push_back(dt_p2p{p.is_send, p.buf.data_ptr(), count(p.buf),
                             dtype_of(p.buf, p.is_send ? "send" : "recv"), p.peer, p.tag});
    dt_work *h = nullptr;
    // One transfer alone is a plain send or receive (the same matching).
    dt_status st = ops.size() > 1 ? dt_group_isendrecv_batch(comm_->g, ops.data(), ops.size(), &h)
                   : ops[0].send  ? dt_group_isend(comm_->g, ops[0].buf, ops[0].count, ops[0].dtype,
                                                   ops[0].peer, ops[0].tag, &h)
                                  : dt_group_irecv(comm_->g, ops[0].buf, ops[0].count, ops[0].dtype,
                                                   ops[0].peer, ops[0].tag, &h);
    if (st != DT_OK) {
        auto err = std::make_exception_ptr(
            std::runtime_error(c10::str("dtrain send/recv: ", dt_last_error())));
        for (const auto &p : batch)
            p.work->fail(err);
        std::rethrow_exception(err);
    }
    auto shared = std::make_shared<Handle>(h);
    for (const auto &p : batch) {
        p.work->add(shared);
        p.work->keep(p.buf);
    }
}

void ProcessGroupDtrain::startCoalescing() {
    std::lock_guard<std::mutex> lock(mu_);
    coalescing_ = true;
}

void ProcessGroupDtrain::endCoalescing(std::vector<c10::intrusive_ptr<c10d::Work>> &) {
    std::lock_guard<std::mutex> lock(mu_);
    coalescing_ = false;
    flush_p2p();
}

} // namespace dtrain_torch
