// Host half of backend/device_info.h: CPU model, cores, memory, OS, compiled-in SIMD, and this
// process's resident-set size (current and peak) from /proc/self/status and getrusage.
#include <sys/resource.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "backend/device_info.h"

namespace nf4flash {
namespace {

// "VmHWM:   123456 kB" -> bytes; 0 when absent.
size_t proc_status_kb(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string k = std::string(key) + ":";
  while (std::getline(in, line)) {
    if (line.compare(0, k.size(), k) == 0) {
      size_t pos = k.size();
      while (pos < line.size() && (line[pos] == ' ' || line[pos] == '\t')) ++pos;
      try {
        return static_cast<size_t>(std::stoull(line.substr(pos))) * 1024;
      } catch (...) {
        return 0;
      }
    }
  }
  return 0;
}

size_t meminfo_kb(const char* key) {
  std::ifstream in("/proc/meminfo");
  std::string line;
  const std::string k = std::string(key) + ":";
  while (std::getline(in, line)) {
    if (line.compare(0, k.size(), k) == 0) {
      try {
        return static_cast<size_t>(std::stoull(line.substr(k.size()))) * 1024;
      } catch (...) {
        return 0;
      }
    }
  }
  return 0;
}

}  // namespace

HostInfo query_host() {
  HostInfo h;
  h.cpu_model = "unknown";
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto c = line.find(':');
      if (c != std::string::npos) {
        h.cpu_model = line.substr(c + 1);
        h.cpu_model.erase(0, h.cpu_model.find_first_not_of(" \t"));
      }
      break;
    }
  }
  h.logical_cores = static_cast<int>(std::thread::hardware_concurrency());
  h.mem_total_bytes = meminfo_kb("MemTotal");
  h.mem_available_bytes = meminfo_kb("MemAvailable");
  if (h.mem_total_bytes == 0) {
    const long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (pages > 0 && psz > 0) h.mem_total_bytes = static_cast<size_t>(pages) * psz;
  }
  struct utsname u {};
  if (uname(&u) == 0) h.os = std::string(u.sysname) + " " + u.release + " " + u.machine;
#if defined(__AVX512F__)
  h.simd = "avx512";
#elif defined(__AVX2__) && defined(__FMA__)
  h.simd = "avx2+fma";
#elif defined(__AVX2__)
  h.simd = "avx2";
#elif defined(__ARM_NEON)
  h.simd = "neon";
#else
  h.simd = "none";
#endif
  return h;
}

size_t host_rss_bytes() { return proc_status_kb("VmRSS"); }

size_t host_peak_rss_bytes() {
  const size_t hwm = proc_status_kb("VmHWM");
  if (hwm > 0) return hwm;
  struct rusage ru {};
  if (getrusage(RUSAGE_SELF, &ru) == 0) return static_cast<size_t>(ru.ru_maxrss) * 1024;  // Linux: KiB
  return 0;
}

bool host_reset_peak_rss() {
  FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

}  // namespace nf4flash
