// dmpcheck's authenticated store: what c10d asks of a store, and who it lets in.
#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "comm/auth_store.h"
#include "comm/store.h"
#include "common/error.h"
#include "test_util.h"

namespace dmpcheck {
namespace {

using std::chrono::milliseconds;

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

TEST(AuthStore, DoesWhatC10dAsksOfAStore) {
  comm::AuthStoreServer server("127.0.0.1", 0, "s", nullptr);
  comm::AuthStoreClient a("127.0.0.1", server.port(), "s", milliseconds(5000));
  comm::AuthStoreClient b("127.0.0.1", server.port(), "s", milliseconds(5000));
  a.set("k", bytes("v"));
  EXPECT_EQ(b.get("k"), bytes("v"));
  EXPECT_EQ(a.add("n", 3), 3);
  EXPECT_EQ(b.add("n", -5), -2);
  EXPECT_TRUE(a.check({"k", "n"}));
  EXPECT_FALSE(a.check({"k", "missing"}));
  EXPECT_EQ(a.getNumKeys(), 2);
  EXPECT_EQ(a.compareSet("c", {}, bytes("first")), bytes("first"));         // absent, expected empty: set
  EXPECT_EQ(a.compareSet("c", bytes("nope"), bytes("x")), bytes("first"));  // mismatch: unchanged
  EXPECT_EQ(a.compareSet("c", bytes("first"), bytes("second")), bytes("second"));
  EXPECT_TRUE(b.deleteKey("c"));
  EXPECT_FALSE(b.deleteKey("c"));
  // A get waits for a key another client sets later.
  std::thread later([&] {
    std::this_thread::sleep_for(milliseconds(100));
    a.set("late", bytes("here"));
  });
  EXPECT_EQ(b.get("late"), bytes("here"));
  later.join();
  b.wait({"k", "late"});
}

TEST(AuthStore, AGetThatNobodyAnswersTimesOut) {
  comm::AuthStoreServer server("127.0.0.1", 0, "s", nullptr);
  comm::AuthStoreClient a("127.0.0.1", server.port(), "s", milliseconds(300));
  EXPECT_TRUE(testing::throws_with(ErrorKind::kTimeout, "", [&] { a.get("never"); }));
  // The connection is still usable after a timeout.
  a.set("k", bytes("v"));
  EXPECT_EQ(a.get("k"), bytes("v"));
  EXPECT_THROW(a.wait({"never"}, milliseconds(100)), Error);
}

TEST(AuthStore, AWrongSecretIsRefusedAndReported) {
  std::vector<std::string> reported;
  std::mutex m;
  comm::AuthStoreServer server("127.0.0.1", 0, "right", [&](const std::string& message) {
    std::lock_guard<std::mutex> lock(m);
    reported.push_back(message);
  });
  EXPECT_TRUE(testing::throws_with(ErrorKind::kCommunication, "refused this rank", [&] {
    comm::AuthStoreClient("127.0.0.1", server.port(), "wrong", milliseconds(5000));
  }));
  for (int i = 0; i < 100 && server.refused_count() == 0; ++i) std::this_thread::sleep_for(milliseconds(10));
  EXPECT_EQ(server.refused_count(), 1);
  std::lock_guard<std::mutex> lock(m);
  ASSERT_EQ(reported.size(), 1u);
  EXPECT_TRUE(testing::contains(reported[0], "from 127.0.0.1:"));
  // The right secret still gets in afterwards.
  comm::AuthStoreClient ok("127.0.0.1", server.port(), "right", milliseconds(5000));
  ok.set("k", bytes("v"));
}

TEST(AuthStore, AClientRefusesAServerThatDoesNotKnowTheSecret) {
  // The impostor holds another secret: it refuses the client's proof, and the client says so
  // rather than handing it anything.
  comm::AuthStoreServer impostor("127.0.0.1", 0, "other", nullptr);
  EXPECT_THROW(comm::AuthStoreClient("127.0.0.1", impostor.port(), "mine", milliseconds(5000)), Error);
}

TEST(AuthStore, AnAddressThatIsNotThisHostsIsAClearError) {
  EXPECT_TRUE(testing::throws_with(ErrorKind::kCommunication, "must be one of this host's",
                                   [] { comm::AuthStoreServer server("192.0.2.123", 0, "s", nullptr); }));
}

}  // namespace
}  // namespace dmpcheck
