// The caching logic of the device and pinned allocators, on a fake backend with a byte budget.
#include <gtest/gtest.h>

#include <cstdlib>

#include "megatron/core/error.h"
#include "megatron/tensor/caching_pool.h"

namespace megatron {
namespace {

struct FakeBackend {
  size_t budget;
  size_t used = 0;
  int mallocs = 0, frees = 0, syncs = 0;
  std::unordered_map<void*, size_t> sizes = {};
  PoolBackend make() {
    return PoolBackend{
        .raw_alloc = [this](size_t b) -> void* {
          if (used + b > budget) return nullptr;
          void* p = std::malloc(b);
          sizes[p] = b;
          used += b;
          ++mallocs;
          return p;
        },
        .raw_free = [this](void* p) { used -= sizes.at(p); sizes.erase(p); std::free(p); ++frees; },
        .before_release = [this] { ++syncs; },
    };
  }
};

StreamHandle stream(int i) { return reinterpret_cast<StreamHandle>(uintptr_t(i)); }

TEST(CachingPool, SizeClasses) {
  EXPECT_EQ(CachingPool::size_class(0), 512u);
  EXPECT_EQ(CachingPool::size_class(1), 512u);
  EXPECT_EQ(CachingPool::size_class(513), 1024u);
  EXPECT_EQ(CachingPool::size_class(1 << 20), size_t(1) << 20);
  EXPECT_EQ(CachingPool::size_class((1 << 20) + 1), size_t(1) << 20 | size_t(1) << 18);  // 1.25 MiB
  constexpr size_t kGiB = size_t(1) << 30;
  EXPECT_EQ(CachingPool::size_class(kGiB + 1), kGiB + kGiB / 64);
  EXPECT_EQ(CachingPool::size_class(29 * kGiB + 5), 29 * kGiB + kGiB / 4);  // 16 GiB / 64 steps
  for (size_t b = 1; b < (size_t(1) << 36); b = b * 3 + 7) {
    size_t c = CachingPool::size_class(b);
    EXPECT_GE(c, b);
    double bound = b >= kGiB ? 1.0 + 1.0 / 64 : 1.25;
    EXPECT_LE(double(c), std::max(bound * double(b), double(b) + 512)) << b;
  }
}

TEST(CachingPool, ReusesBySizeClassAndStream) {
  FakeBackend fake{.budget = 1 << 30};
  CachingPool pool(fake.make());
  void* a = pool.allocate(1000, stream(1));
  pool.deallocate(a);
  EXPECT_EQ(pool.allocate(900, stream(1)), a);  // same class (1024), same stream: reused
  void* b = pool.allocate(900, stream(2));      // other stream: fresh block
  EXPECT_NE(b, a);
  EXPECT_EQ(fake.mallocs, 2);
  AllocatorStats s = pool.stats();
  EXPECT_EQ(s.allocated_bytes, 2048u);
  EXPECT_EQ(s.reserved_bytes, 2048u);
  EXPECT_EQ(s.num_cache_hits, 1u);
  pool.deallocate(b);
  EXPECT_EQ(pool.stats().allocated_bytes, 1024u);
  EXPECT_EQ(pool.stats().reserved_bytes, 2048u);
  EXPECT_EQ(pool.stats().peak_allocated_bytes, 2048u);
}

TEST(CachingPool, OutOfMemoryReleasesCacheAndRetries) {
  FakeBackend fake{.budget = 4 << 20};
  CachingPool pool(fake.make());
  void* a = pool.allocate(3 << 20, stream(1));
  pool.deallocate(a);                            // 3 MiB cached, budget 4 MiB
  void* b = pool.allocate(2 << 20, stream(1));   // does not fit next to the cache: release, retry
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(fake.syncs, 1);
  EXPECT_EQ(pool.stats().num_ooms_recovered, 1u);
  EXPECT_EQ(pool.stats().reserved_bytes, size_t(2) << 20);
  EXPECT_EQ(pool.allocate(3 << 20, stream(1)), nullptr);  // truly out of memory
  pool.deallocate(b);
}

TEST(CachingPool, RejectsForeignPointer) {
  FakeBackend fake{.budget = 1 << 20};
  CachingPool pool(fake.make());
  int x;
  EXPECT_THROW(pool.deallocate(&x), Error);
}

}  // namespace
}  // namespace megatron
