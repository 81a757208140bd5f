// kfray_sycl_compile: compile one candidate for one SYCL device, in a process of its own.
//
//   kfray_sycl_compile DEVICE LANG OUT [--kernel=NAME ...] [-- BUILD_OPTIONS ...]  < source
//
// DEVICE is a full dpctl filter string (backend:type:index, e.g. opencl:cpu:0). LANG is
//   sycl    SYCL C++ free-function kernels, compiled through sycl_ext_oneapi_kernel_compiler;
//           OUT receives the SYCLBIN of the object-state bundle, which the sandbox links.
//   opencl  OpenCL C, built with clBuildProgram on the device (the build log is the diagnostic);
//           OUT receives the source unchanged.
// Each --kernel must exist in the result. Diagnostics go to stderr. Exit status: 0 built,
// 1 the source does not compile (or lacks a kernel), 3 the device or the route is unavailable.
#ifndef SYCL_DISABLE_FSYCL_SYCLHPP_WARNING
#define SYCL_DISABLE_FSYCL_SYCLHPP_WARNING 1
#endif
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <sycl/sycl.hpp>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

namespace syclex = sycl::ext::oneapi::experimental;

static std::string backend_name(sycl::backend b) {
  switch (b) {
    case sycl::backend::opencl: return "opencl";
    case sycl::backend::ext_oneapi_level_zero: return "level_zero";
    case sycl::backend::ext_oneapi_cuda: return "cuda";
    case sycl::backend::ext_oneapi_hip: return "hip";
    default: return "other";
  }
}

static std::string type_name(sycl::info::device_type t) {
  switch (t) {
    case sycl::info::device_type::cpu: return "cpu";
    case sycl::info::device_type::gpu: return "gpu";
    case sycl::info::device_type::accelerator: return "accelerator";
    default: return "other";
  }
}

// The device a full filter string (backend:type:index) names: the index counts the devices of
// that backend and type in platform order, as dpctl does.
static bool find_device(const std::string& filter, sycl::device& out) {
  std::vector<std::string> parts;
  std::stringstream ss(filter);
  for (std::string p; std::getline(ss, p, ':');) parts.push_back(p);
  if (parts.size() != 3) return false;
  int want = std::stoi(parts[2]), seen = 0;
  for (const auto& d : sycl::device::get_devices()) {
    if (backend_name(d.get_backend()) != parts[0]) continue;
    if (type_name(d.get_info<sycl::info::device::device_type>()) != parts[1]) continue;
    if (seen++ == want) {
      out = d;
      return true;
    }
  }
  return false;
}

static int build_sycl(sycl::device dev, const std::string& src, const std::vector<std::string>& opts,
                      const std::vector<std::string>& kernels, const std::string& out) {
  if (!dev.ext_oneapi_can_build(syclex::source_language::sycl)) {
    std::cerr << "this device cannot build SYCL source at run time (sycl_ext_oneapi_kernel_compiler)\n";
    return 3;
  }
  sycl::context ctx(dev);
  std::string log;
  try {
    auto src_kb = syclex::create_kernel_bundle_from_source(ctx, syclex::source_language::sycl, src);
    auto obj = syclex::compile(src_kb, std::vector<sycl::device>{dev},
                               syclex::properties{syclex::build_options{opts}, syclex::save_log{&log}});
    auto exe = sycl::link(obj, {dev});   // device code generation: its errors are compile errors too
    for (const auto& k : kernels) {
      if (!exe.ext_oneapi_has_kernel(k)) {
        std::cerr << "no kernel named '" << k << "' in the compiled source: a @kf.launch kernel must be a "
                     "free function declared extern \"C\" with "
                     "SYCL_EXT_ONEAPI_FUNCTION_PROPERTY((syclexp::nd_range_kernel<N>))\n";
        return 1;
      }
    }
    std::vector<char> bin = obj.ext_oneapi_get_content();
    std::ofstream f(out, std::ios::binary);
    f.write(bin.data(), static_cast<std::streamsize>(bin.size()));
    if (!f) {
      std::cerr << "cannot write " << out << "\n";
      return 3;
    }
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    if (!log.empty()) std::cerr << log << "\n";
    return 1;
  }
  if (!log.empty()) std::cout << log;   // warnings of a successful build
  return 0;
}

static int build_opencl(sycl::device dev, const std::string& src, const std::vector<std::string>& opts,
                        const std::vector<std::string>& kernels, const std::string& out) {
  if (dev.get_backend() != sycl::backend::opencl) {
    // Not an OpenCL device: nothing here can check the source; the sandbox's build reports errors.
    std::ofstream(out) << src;
    std::cout << "not checked: the device is not an OpenCL device\n";
    return 0;
  }
  cl_device_id cdev = sycl::get_native<sycl::backend::opencl>(dev);
  cl_int rc = CL_SUCCESS;
  cl_context cctx = clCreateContext(nullptr, 1, &cdev, nullptr, nullptr, &rc);
  if (rc != CL_SUCCESS) {
    std::cerr << "clCreateContext failed with " << rc << "\n";
    return 3;
  }
  const char* text = src.c_str();
  size_t len = src.size();
  cl_program prog = clCreateProgramWithSource(cctx, 1, &text, &len, &rc);
  std::string joined;
  for (const auto& o : opts) joined += o + " ";
  rc = clBuildProgram(prog, 1, &cdev, joined.c_str(), nullptr, nullptr);
  size_t log_size = 0;
  clGetProgramBuildInfo(prog, cdev, CL_PROGRAM_BUILD_LOG, 0, nullptr, &log_size);
  std::string log(log_size, '\0');
  if (log_size) clGetProgramBuildInfo(prog, cdev, CL_PROGRAM_BUILD_LOG, log_size, log.data(), nullptr);
  while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
  if (rc != CL_SUCCESS) {
    std::cerr << "OpenCL C build failed (error " << rc << ")\n" << log << "\n";
    return 1;
  }
  for (const auto& k : kernels) {
    cl_kernel kern = clCreateKernel(prog, k.c_str(), &rc);
    if (rc != CL_SUCCESS) {
      std::cerr << "no kernel named '" << k << "' in the OpenCL C source (declare it __kernel void " << k
                << "(...))\n";
      return 1;
    }
    clReleaseKernel(kern);
  }
  clReleaseProgram(prog);
  clReleaseContext(cctx);
  std::ofstream(out) << src;
  if (!log.empty()) std::cout << log << "\n";
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 4) {
    std::cerr << "usage: kfray_sycl_compile DEVICE LANG OUT [--kernel=NAME ...] [-- OPTIONS ...] < source\n";
    return 3;
  }
  std::string filter = argv[1], lang = argv[2], out = argv[3];
  std::vector<std::string> kernels, opts;
  bool in_opts = false;
  for (int i = 4; i < argc; ++i) {
    std::string a = argv[i];
    if (in_opts) opts.push_back(a);
    else if (a == "--") in_opts = true;
    else if (a.rfind("--kernel=", 0) == 0) kernels.push_back(a.substr(9));
    else {
      std::cerr << "unknown argument " << a << "\n";
      return 3;
    }
  }
  std::string src((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  try {
    sycl::device dev;
    if (!find_device(filter, dev)) {
      std::cerr << "no SYCL device matches '" << filter << "'\n";
      return 3;
    }
    if (lang == "sycl") return build_sycl(dev, src, opts, kernels, out);
    if (lang == "opencl") return build_opencl(dev, src, opts, kernels, out);
    std::cerr << "unknown language " << lang << "\n";
    return 3;
  } catch (const std::exception& e) {
    std::cerr << "SYCL runtime error: " << e.what() << "\n";
    return 3;
  }
}
