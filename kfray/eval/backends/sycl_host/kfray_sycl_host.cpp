// kfray's SYCL host library, loaded by ctypes inside the sandbox worker.
//
// It takes the sycl::queue* behind a dpctl SyclQueue, loads a kernel bundle that
// kfray_sycl_compile produced (SYCLBIN, object state), links it for the queue's device, and
// launches free-function kernels with the nd-range a candidate declares. Every launch hands back
// its sycl::event so the backend can read the profiling timestamps.
//
// Built with plain g++ against intel-sycl-rt's headers (no SYCL compiler: there is no device code
// here). Every entry point catches all exceptions and reports them through an error buffer.
#ifndef SYCL_DISABLE_FSYCL_SYCLHPP_WARNING
#define SYCL_DISABLE_FSYCL_SYCLHPP_WARNING 1
#endif
#include <sycl/sycl.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace syclex = sycl::ext::oneapi::experimental;

#define KF_API extern "C" __attribute__((visibility("default")))

namespace {

void put(char* err, size_t cap, const std::string& msg) {
  if (err && cap) std::snprintf(err, cap, "%s", msg.c_str());
}

enum ArgKind : int { KF_PTR = 0, KF_F32 = 1, KF_F64 = 2, KF_I32 = 3, KF_I64 = 4 };

struct Bundle {
  sycl::kernel_bundle<sycl::bundle_state::executable> exe;
};

template <int D>
sycl::nd_range<D> make_range(const size_t* g, const size_t* l) {
  sycl::range<D> gr = sycl::range<D>(), lr = sycl::range<D>();
  for (int i = 0; i < D; ++i) {
    gr[i] = g[i];
    lr[i] = l[i];
  }
  return sycl::nd_range<D>(gr, lr);
}

}  // namespace

KF_API int kf_version() { return 1; }

// SYCLBIN bytes (object state) -> an executable bundle for the queue's device.
KF_API void* kf_bundle_load(void* queue, const char* data, size_t size, char* err, size_t cap) {
  try {
    auto& q = *static_cast<sycl::queue*>(queue);
    std::vector<char> bytes(data, data + size);
    auto obj = syclex::get_kernel_bundle<sycl::bundle_state::object>(
        q.get_context(), {q.get_device()}, sycl::span<char>(bytes.data(), bytes.size()));
    return new Bundle{sycl::link(obj, {q.get_device()})};
  } catch (const std::exception& e) {
    put(err, cap, std::string("loading the compiled kernel bundle failed: ") + e.what());
  } catch (...) {
    put(err, cap, "loading the compiled kernel bundle failed (unknown exception)");
  }
  return nullptr;
}

KF_API void kf_bundle_free(void* bundle) { delete static_cast<Bundle*>(bundle); }

KF_API void* kf_kernel_get(void* bundle, const char* name, char* err, size_t cap) {
  try {
    auto* b = static_cast<Bundle*>(bundle);
    if (!b->exe.ext_oneapi_has_kernel(name)) {
      put(err, cap, std::string("no kernel named '") + name + "' in the compiled bundle");
      return nullptr;
    }
    return new sycl::kernel(b->exe.ext_oneapi_get_kernel(name));
  } catch (const std::exception& e) {
    put(err, cap, std::string("getting kernel '") + name + "' failed: " + e.what());
  } catch (...) {
    put(err, cap, "getting the kernel failed (unknown exception)");
  }
  return nullptr;
}

KF_API void kf_kernel_free(void* kernel) { delete static_cast<sycl::kernel*>(kernel); }

// Largest work-group size the compiled kernel allows on the queue's device (0 when unknown).
KF_API size_t kf_kernel_max_wg(void* queue, void* kernel) {
  try {
    auto& q = *static_cast<sycl::queue*>(queue);
    auto& k = *static_cast<sycl::kernel*>(kernel);
    return k.get_info<sycl::info::kernel_device_specific::work_group_size>(q.get_device());
  } catch (...) {
    return 0;
  }
}

// Launch one kernel: values[i] points at the i-th argument (a void* holding the USM address for
// pointers). Returns a heap sycl::event (free it with kf_event_free), or null with `err` set.
KF_API void* kf_launch(void* queue, void* kernel, int nargs, const int* kinds, const void* const* values,
                       int dims, const size_t* global, const size_t* local, char* err, size_t cap) {
  try {
    auto& q = *static_cast<sycl::queue*>(queue);
    auto& k = *static_cast<sycl::kernel*>(kernel);
    sycl::event ev = q.submit([&](sycl::handler& h) {
      for (int i = 0; i < nargs; ++i) {
        switch (kinds[i]) {
          case KF_PTR: h.set_arg(i, *static_cast<void* const*>(values[i])); break;
          case KF_F32: h.set_arg(i, *static_cast<const float*>(values[i])); break;
          case KF_F64: h.set_arg(i, *static_cast<const double*>(values[i])); break;
          case KF_I32: h.set_arg(i, *static_cast<const int32_t*>(values[i])); break;
          case KF_I64: h.set_arg(i, *static_cast<const int64_t*>(values[i])); break;
          default: throw std::runtime_error("unknown argument kind");
        }
      }
      if (dims == 1) h.parallel_for(make_range<1>(global, local), k);
      else if (dims == 2) h.parallel_for(make_range<2>(global, local), k);
      else if (dims == 3) h.parallel_for(make_range<3>(global, local), k);
      else throw std::runtime_error("nd-range must have 1, 2 or 3 dimensions");
    });
    return new sycl::event(ev);
  } catch (const std::exception& e) {
    put(err, cap, std::string("kernel launch failed: ") + e.what());
  } catch (...) {
    put(err, cap, "kernel launch failed (unknown exception)");
  }
  return nullptr;
}

// A barrier on the queue, as an event (its timestamps bracket the work before and after it).
KF_API void* kf_barrier(void* queue, char* err, size_t cap) {
  try {
    auto& q = *static_cast<sycl::queue*>(queue);
    return new sycl::event(q.ext_oneapi_submit_barrier());
  } catch (const std::exception& e) {
    put(err, cap, std::string("barrier failed: ") + e.what());
  }
  return nullptr;
}

// Wait for the event and read its device timestamps (ns). Returns 0, or -1 with `err` set.
KF_API int kf_event_times(void* event, uint64_t* start, uint64_t* end, char* err, size_t cap) {
  try {
    auto& ev = *static_cast<sycl::event*>(event);
    ev.wait_and_throw();
    *start = ev.get_profiling_info<sycl::info::event_profiling::command_start>();
    *end = ev.get_profiling_info<sycl::info::event_profiling::command_end>();
    return 0;
  } catch (const std::exception& e) {
    put(err, cap, e.what());
  } catch (...) {
    put(err, cap, "unknown exception");
  }
  return -1;
}

KF_API void kf_event_free(void* event) { delete static_cast<sycl::event*>(event); }

// Wait for everything on the queue; async errors come back through `err`.
KF_API int kf_queue_wait(void* queue, char* err, size_t cap) {
  try {
    static_cast<sycl::queue*>(queue)->wait_and_throw();
    return 0;
  } catch (const std::exception& e) {
    put(err, cap, e.what());
  } catch (...) {
    put(err, cap, "unknown exception");
  }
  return -1;
}
