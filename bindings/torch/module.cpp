// module.cpp — dtrain_torch._C: the Python side of the PyTorch backend.
// dtrain_torch/__init__.py registers create_process_group with
// torch.distributed.Backend.register_backend and job_info behind the
// dtrain:// init method.
#include "process_group.hpp"

#include <torch/csrc/utils/pybind.h>

namespace py = pybind11;
using dtrain_torch::ProcessGroupDtrain;

PYBIND11_MODULE(_C, m) {
    m.doc() = "dtrain's collectives as a torch.distributed backend";
    // The ProcessGroup and Store types this module passes must be known to
    // pybind11 first.
    py::module::import("torch.distributed");

    m.def(
        "create_process_group",
        [](const c10::intrusive_ptr<c10d::Store> &store, int rank, int size, double timeout_s) {
            return c10::intrusive_ptr<c10d::ProcessGroup>(
                c10::make_intrusive<ProcessGroupDtrain>(store, rank, size, timeout_s));
        },
        py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout_s"),
        py::call_guard<py::gil_scoped_release>(),
        "Collective: a dtrain process group over the ranks that meet through store "
        "(timeout_s <= 0: DT_TIMEOUT).");

    m.def(
        "transport",
        [](const c10::intrusive_ptr<c10d::ProcessGroup> &pg) {
            auto *d = dynamic_cast<ProcessGroupDtrain *>(pg.get());
            TORCH_CHECK(d, "dtrain_torch.transport: not a dtrain process group (backend ",
                        pg->getBackendName(), ")");
            return d->transport();
        },
        "The transports a dtrain process group uses: shm, tcp, shm+tcp or self.");

    m.def(
        "job_info",
        [] {
            dt_job_info ji;
            if (dt_job_info_read(&ji) != DT_OK)
                throw std::runtime_error(c10::str("dtrain: ", dt_last_error()));
            py::dict d;
            d["rank"] = ji.rank;
            d["size"] = ji.size;
            d["local_rank"] = ji.local_rank;
            d["local_size"] = ji.local_size;
            d["master_addr"] = std::string(ji.master_addr);
            d["master_port"] = ji.master_port;
            d["job_id"] = std::string(ji.job_id);
            return d;
        },
        "Rank, size and meeting place from dtrain launch, mpirun or srun (dt_job_info_read).");
}
