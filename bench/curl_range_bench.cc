// sk_curl_range_bench: the client CPU one HTTP range request costs with libcurl, the
// easy interface in T threads (as the wds reader's read-ahead does: one blocking
// curl_easy_perform per sample) against one multi handle driving K transfers from one
// thread. Issue 14, round 15: whether moving the read-ahead to the multi
// interface would lower the HTTP loader's CPU per image (docs/benchmarks.md).
// Usage: sk_curl_range_bench URL OBJECT_BYTES REQUESTS easy|multi CONCURRENCY [LENGTH]
//   (LENGTH: bytes per range, default 92000, the corpus's mean image)
#include <curl/curl.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Sink {
  char* p = nullptr;
  size_t got = 0, cap = 0;
};

size_t OnWrite(char* d, size_t s, size_t n, void* u) {
  auto* b = static_cast<Sink*>(u);
  const size_t l = s * n;
  if (b->got + l > b->cap) return 0;
  std::memcpy(b->p + b->got, d, l);
  b->got += l;
  return l;
}

double CpuSeconds() {
  rusage r{};
  getrusage(RUSAGE_SELF, &r);
  return static_cast<double>(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
         static_cast<double>(r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e6;
}

// One range request's options on a handle (reset first, as HttpClient::Perform does).
void Prepare(CURL* h, const std::string& url, const std::string& range, Sink* sink) {
  curl_easy_reset(h);
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_RANGE, range.c_str());
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, &OnWrite);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, sink);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
}

std::string RandomRange(std::mt19937_64& rng, uint64_t object, uint64_t len) {
  const uint64_t off = rng() % (object - len);
  return std::to_string(off) + "-" + std::to_string(off + len - 1);
}

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "sk_curl_range_bench: %s\n", what);
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) Fail("usage: URL OBJECT_BYTES REQUESTS easy|multi CONCURRENCY [LENGTH]");
  const std::string url = argv[1], mode = argv[4];
  const uint64_t object = std::strtoull(argv[2], nullptr, 10);
  const int requests = std::atoi(argv[3]), k = std::atoi(argv[5]);
  const uint64_t len = argc > 6 ? std::strtoull(argv[6], nullptr, 10) : 92000;
  if (object <= len || requests <= 0 || k <= 0 || (mode != "easy" && mode != "multi")) Fail("bad arguments");
  curl_global_init(CURL_GLOBAL_DEFAULT);
  const auto t0 = std::chrono::steady_clock::now();
  const double c0 = CpuSeconds();
  if (mode == "easy") {
    std::atomic<int> next{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < k; ++t)
      threads.emplace_back([&, t] {
        CURL* h = curl_easy_init();
        std::vector<char> buf(len);
        std::mt19937_64 rng(t);
        while (next.fetch_add(1) < requests) {
          Sink sink{buf.data(), 0, len};
          const std::string range = RandomRange(rng, object, len);
          Prepare(h, url, range, &sink);
          if (curl_easy_perform(h) != CURLE_OK || sink.got != len) Fail("a request failed");
        }
        curl_easy_cleanup(h);
      });
    for (auto& t : threads) t.join();
  } else {
    CURLM* m = curl_multi_init();
    std::mt19937_64 rng(1);
    std::vector<CURL*> handles(k);
    std::vector<std::vector<char>> bufs(k, std::vector<char>(len));
    std::vector<Sink> sinks(k);
    std::vector<std::string> ranges(k);
    int started = 0, done = 0;
    auto start = [&](int i) {
      sinks[i] = Sink{bufs[i].data(), 0, len};
      ranges[i] = RandomRange(rng, object, len);
      Prepare(handles[i], url, ranges[i], &sinks[i]);
      curl_easy_setopt(handles[i], CURLOPT_PRIVATE, reinterpret_cast<void*>(static_cast<intptr_t>(i)));
      curl_multi_add_handle(m, handles[i]);
      ++started;
    };
    for (int i = 0; i < k; ++i) {
      handles[i] = curl_easy_init();
      if (started < requests) start(i);
    }
    while (done < requests) {
      int running = 0;
      curl_multi_perform(m, &running);
      int queued = 0;
      while (CURLMsg* msg = curl_multi_info_read(m, &queued)) {
        if (msg->msg != CURLMSG_DONE) continue;
        void* pv = nullptr;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, &pv);
        const int i = static_cast<int>(reinterpret_cast<intptr_t>(pv));
        if (msg->data.result != CURLE_OK || sinks[i].got != len) Fail("a request failed");
        curl_multi_remove_handle(m, msg->easy_handle);
        ++done;
        if (started < requests) start(i);
      }
      if (done < requests) curl_multi_poll(m, nullptr, 0, 1000, nullptr);
    }
    for (CURL* h : handles) curl_easy_cleanup(h);
    curl_multi_cleanup(m);
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu = CpuSeconds() - c0;
  std::printf("%-5s concurrency %-3d %d requests of %llu bytes: %.2f s, %.0f requests/s, client CPU %.1f us per request\n",
              mode.c_str(), k, requests, static_cast<unsigned long long>(len), wall, requests / wall,
              cpu / requests * 1e6);
  curl_global_cleanup();
  return 0;
}
