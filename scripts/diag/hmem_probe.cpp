// Can this machine's libfabric register CUDA memory (FI_HMEM_CUDA) with the shm and tcp
// providers, and send a device buffer between two endpoints of one process? (GPUDirect needs it.)
//   nvcc -O2 -I third_party/libfabric-1.17/include -o hmem_probe scripts/diag/hmem_probe.cpp -l:libfabric.so.1
//   ./hmem_probe
// Result on the GPU machine (Ubuntu's libfabric 1.17): results/2026-12-01-fabric-hmem-probe/.
#include <cuda_runtime.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <cstdio>
#include <cstring>
#include <sys/uio.h>

static void probe(const char* prov) {
  fi_info* hints = fi_allocinfo();
  hints->caps = FI_TAGGED | FI_HMEM;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_HMEM | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  hints->fabric_attr->prov_name = strdup(prov);
  fi_info* info = nullptr;
  int r = fi_getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, hints, &info);
  std::printf("%s: fi_getinfo(FI_TAGGED|FI_HMEM) = %d (%s)\n", prov, r, r ? fi_strerror(-r) : "ok");
  if (r) { fi_freeinfo(hints); return; }
  std::printf("  provider %s, caps has FI_HMEM: %d, mr_mode 0x%x\n", info->fabric_attr->prov_name,
              (info->caps & FI_HMEM) != 0, info->domain_attr->mr_mode);
  fid_fabric* fabric = nullptr; fid_domain* domain = nullptr;
  r = fi_fabric(info->fabric_attr, &fabric, nullptr);
  if (!r) r = fi_domain(fabric, info, &domain, nullptr);
  std::printf("  fabric/domain: %d\n", r);
  if (!r) {
    void* d = nullptr;
    cudaSetDevice(0);
    cudaError_t ce = cudaMalloc(&d, 1 << 20);
    std::printf("  cudaMalloc: %s\n", cudaGetErrorString(ce));
    iovec iov{d, 1 << 20};
    fi_mr_attr attr{};
    attr.mr_iov = &iov; attr.iov_count = 1; attr.access = FI_SEND | FI_RECV;
    attr.iface = FI_HMEM_CUDA; attr.device.cuda = 0;
    fid_mr* mr = nullptr;
    r = fi_mr_regattr(domain, &attr, 0, &mr);
    std::printf("  fi_mr_regattr(FI_HMEM_CUDA) = %d (%s)\n", r, r ? fi_strerror(-r) : "ok");
    if (mr) fi_close(&mr->fid);
    cudaFree(d);
    fi_close(&domain->fid);
  }
  if (fabric) fi_close(&fabric->fid);
  fi_freeinfo(info);
  fi_freeinfo(hints);
}

int main() {
  probe("shm");
  probe("tcp");
  probe("tcp;ofi_rxm");
  return 0;
}
