// Portable parallel_for for torch-free callers (the C API): n work items split into
// `threads` contiguous ranges, the first run by the calling thread, the others by a
// process-wide pool of parked worker threads. A decoder pass has ~150 parallel regions (every
// projection, attention, the row-local steps), so starting threads per region (~10-20 us
// each) would cost a sizeable share of a ~10 ms step. The kernels never depend on the split,
// so any thread count gives the same bits.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__unix__) || defined(__APPLE__) || defined(__ANDROID__)
#include <pthread.h>
#define MTP_HAVE_PTHREAD_ATFORK 1
#else
#define MTP_HAVE_PTHREAD_ATFORK 0
#endif

namespace mtp {

// The most threads one region uses (the C API's MTP_MAX_THREADS): the pool never grows past
// kMaxThreads - 1 workers, and a region asked for more runs on kMaxThreads.
constexpr int kMaxThreads = 256;

// A thread count of 0 means one per hardware thread; either way at most kMaxThreads.
inline int resolve_threads(int threads) {
  if (threads <= 0) {
    const unsigned hw = std::thread::hardware_concurrency();
    threads = hw ? int(std::min<unsigned>(hw, unsigned(kMaxThreads))) : 1;
  }
  return std::min(threads, kMaxThreads);
}

// Range p of n items in `parts`: [n*p/parts, n*(p+1)/parts).
inline int64_t range_begin(int64_t n, int64_t p, int64_t parts) { return n * p / parts; }

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
  __asm__ __volatile__("yield");
#endif
}

// Starts `out` running f, or returns false (nothing started) where the system refuses a thread:
// resource limits throw std::system_error (a build without exceptions aborts instead).
template <class F>
bool start_thread(std::thread& out, F&& f) {
#if defined(__cpp_exceptions)
  try {
    out = std::thread(std::forward<F>(f));
  } catch (...) {
    return false;
  }
#else
  out = std::thread(std::forward<F>(f));
#endif
  return true;
}

// Worker threads started on first use and grown to the largest count asked for; between
// regions they spin briefly (the next region of a pass follows within microseconds), then
// sleep on a condition variable. One region at a time: run() returns false for a caller that
// finds the pool busy (another thread's region, or a region started inside a region), which
// then starts threads of its own. Never destroyed: its threads sleep until the process exits.
// Fork-safe: a fork()ed child has none of the parent's workers (and maybe a mutex some parent
// thread held), so a pthread_atfork child handler drops the parent's pool (leaked, never
// touched again) and the child's first threaded call starts a fresh one.
class ThreadPool {
 public:
  using Task = void (*)(void* fn, int64_t begin, int64_t end);

  static ThreadPool& instance() {
    static const bool registered = register_fork_handler();
    (void)registered;
    ThreadPool* pool = current().load(std::memory_order_acquire);
    if (!pool) {  // first use, or the first use in a forked child
      ThreadPool* fresh = new ThreadPool;
      if (current().compare_exchange_strong(pool, fresh, std::memory_order_acq_rel))
        pool = fresh;
      else
        delete fresh;  // another thread installed one first: pool holds it
    }
    return *pool;
  }

  // Runs task(fn, range p) for every range p of n items in `parts` (range 0 here), or returns
  // false having run nothing.
  bool run(int64_t n, int64_t parts, Task task, void* fn) {
    if (inside_region()) return false;
    std::unique_lock<std::mutex> region(region_, std::try_to_lock);
    if (!region.owns_lock() || !grow(int(parts - 1))) return false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = Job{task, fn, n, parts};
      pending_.store(parts - 1, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    inside_region() = true;
    task(fn, 0, range_begin(n, 1, parts));
    inside_region() = false;
    if (!spin_until([&] { return pending_.load(std::memory_order_acquire) == 0; })) {
      std::unique_lock<std::mutex> lock(mutex_);
      done_.wait(lock, [&] { return pending_.load(std::memory_order_acquire) == 0; });
    }
    return true;
  }

 private:
  struct Job {
    Task task = nullptr;
    void* fn = nullptr;
    int64_t n = 0, parts = 0;
  };
  // How long a waiting thread polls before it sleeps: the regions of a pass follow each other
  // within microseconds, a sleeping worker takes a system call to wake.
  static constexpr std::chrono::microseconds kSpin{100};

  static std::atomic<ThreadPool*>& current() {
    static std::atomic<ThreadPool*> pool{nullptr};
    return pool;
  }
  // Runs in the child right after fork(), single-threaded: only an atomic store.
  static void forget_after_fork() {
    current().store(nullptr, std::memory_order_relaxed);
    inside_region() = false;  // the forking thread may have been inside a region
  }
  static bool register_fork_handler() {
#if MTP_HAVE_PTHREAD_ATFORK
    pthread_atfork(nullptr, nullptr, &ThreadPool::forget_after_fork);
#endif
    return true;
  }

  static bool& inside_region() {
    thread_local bool inside = false;
    return inside;
  }
  template <class Done>
  static bool spin_until(Done&& done) {
    const auto end = std::chrono::steady_clock::now() + kSpin;
    for (;;) {
      for (int i = 0; i < 64; ++i) {
        if (done()) return true;
        cpu_relax();
      }
      if (std::chrono::steady_clock::now() > end) return done();
    }
  }

  // Starts workers up to `count` (before the region's job is published: a new worker waits
  // for the generation after the current one); false if the system refuses a thread.
  bool grow(int count) {
    if (count > kMaxThreads - 1) return false;  // never past the cap (callers clamp before)
    const uint64_t now = generation_.load(std::memory_order_relaxed);
    while (int(workers_) < count) {
      std::thread t;
      if (!start_thread(t, [this, index = int(workers_) + 1, now] { work(index, now); })) return false;
      t.detach();
      ++workers_;
    }
    return true;
  }

  void work(int index, uint64_t seen) {
    inside_region() = true;  // a region started by a task runs on threads of its own
    for (;;) {
      const auto fresh = [&] { return generation_.load(std::memory_order_acquire) != seen; };
      if (!spin_until(fresh)) {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, fresh);
      }
      Job job;
      {  // the generation and its job together: a worker left out of one region may look
         // while the caller already publishes the next
        std::lock_guard<std::mutex> lock(mutex_);
        seen = generation_.load(std::memory_order_relaxed);
        job = job_;
      }
      if (index >= job.parts) continue;
      job.task(job.fn, range_begin(job.n, index, job.parts), range_begin(job.n, index + 1, job.parts));
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        {
          std::lock_guard<std::mutex> lock(mutex_);
        }  // the caller is waiting or will see 0
        done_.notify_one();
      }
    }
  }

  std::mutex region_;  // held by the caller for a whole region
  std::mutex mutex_;   // guards job_ and the condition variables' predicates
  std::condition_variable wake_, done_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int64_t> pending_{0};
  Job job_;
  unsigned workers_ = 0;  // guarded by region_
};

struct ThreadParallelFor {
  int threads = 1;

  template <class Fn>
  void operator()(int64_t n, Fn&& fn) const {
    const int64_t parts = std::min<int64_t>(std::clamp(threads, 1, kMaxThreads), n);
    if (parts <= 1) {
      if (n > 0) fn(int64_t(0), n);
      return;
    }
    using F = std::remove_reference_t<Fn>;
    const ThreadPool::Task task = [](void* f, int64_t b, int64_t e) { (*static_cast<F*>(f))(b, e); };
    if (ThreadPool::instance().run(n, parts, task, const_cast<void*>(static_cast<const void*>(&fn)))) return;
    // The pool is busy: threads of this region's own.
    std::vector<std::thread> pool;
    pool.reserve(size_t(parts - 1));
    for (int64_t p = 1; p < parts; ++p) {
      const int64_t b = range_begin(n, p, parts), e = range_begin(n, p + 1, parts);
      std::thread t;
      if (start_thread(t, [&fn, b, e] { fn(b, e); }))
        pool.push_back(std::move(t));
      else
        fn(b, e);  // no thread to be had (resource limits): run that range here
    }
    fn(int64_t(0), range_begin(n, 1, parts));
    for (auto& t : pool) t.join();
  }
};

}  // namespace mtp
