// EtcdClient's calls against a real etcd: endpoints, leases, watches, and
// failing over to a second endpoint.
#include "cluster/membership/etcd_client.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/cluster/membership/etcd_server.h"

namespace pst {
namespace PST_FILE_ID {

absl::Time In(absl::Duration d) { return absl::Now() + d; }

TEST(EtcdClientEndpointsTest, MalformedEndpointsAreRefused) {
  for (const std::vector<std::string>& endpoints : std::vector<std::vector<std::string>>{
           {}, {""}, {"localhost"}, {"https://h:2379"}, {"http://h:2379/v3"}}) {
    SCOPED_TRACE(endpoints.empty() ? "(none)" : endpoints[0]);
    EXPECT_EQ(EtcdClient::Connect(endpoints).status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_TRUE(EtcdClient::Connect({"http://127.0.0.1:2379/", "10.0.0.1:2379"}).ok());
}

class EtcdClientTest : public EtcdTest {
 protected:
  void SetUp() override {
    EtcdTest::SetUp();
    if (HasFatalFailure()) return;
    absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Connect({etcd_->endpoint()});
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  std::unique_ptr<EtcdClient> client_;
};

TEST_F(EtcdClientTest, ALeaseIsGrantedRenewedAndRevoked) {
  absl::StatusOr<EtcdClient::Lease> lease =
      client_->GrantLease(absl::Seconds(1), In(absl::Seconds(10)));
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_NE(lease->id, 0);
  EXPECT_EQ(lease->ttl, absl::Seconds(1));  // the test's etcd allows 1 s
  absl::StatusOr<absl::Duration> renewed = client_->KeepAliveOnce(lease->id, In(absl::Seconds(10)));
  ASSERT_TRUE(renewed.ok()) << renewed.status();
  EXPECT_EQ(*renewed, absl::Seconds(1));
  ASSERT_TRUE(client_->RevokeLease(lease->id, In(absl::Seconds(10))).ok());
  EXPECT_EQ(client_->KeepAliveOnce(lease->id, In(absl::Seconds(10))).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->RevokeLease(lease->id, In(absl::Seconds(10))).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->GrantLease(absl::ZeroDuration(), In(absl::Seconds(10))).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(EtcdClientTest, AWatchReportsAChangeAfterTheRevisionRead) {
  absl::StatusOr<etcdserverpb::RangeResponse> read = client_->Get("/k", In(absl::Seconds(10)));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->kvs_size(), 0);
  // A write between the read and the watch is not missed.
  etcdserverpb::TxnRequest txn;
  etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
  put->set_key("/k");
  put->set_value("v");
  ASSERT_TRUE(client_->Txn(txn, In(absl::Seconds(10))).ok());
  absl::StatusOr<std::vector<mvccpb::Event>> events =
      client_->AwaitEvents("/k", read->header().revision(), In(absl::Seconds(10)));
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].type(), mvccpb::Event::PUT);
  EXPECT_EQ((*events)[0].kv().value(), "v");
  // Nothing after it: the deadline ends the wait.
  const absl::Time start = absl::Now();
  EXPECT_EQ(
      client_->AwaitEvents("/k", (*events)[0].kv().mod_revision(), start + absl::Milliseconds(200))
          .status()
          .code(),
      absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST_F(EtcdClientTest, ADeadEndpointIsPassedOverForTheNextOne) {
  // Port 1 on loopback refuses connections: UNAVAILABLE, then the next one.
  absl::StatusOr<std::unique_ptr<EtcdClient>> client =
      EtcdClient::Connect({"127.0.0.1:1", etcd_->endpoint()});
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<etcdserverpb::RangeResponse> read = (*client)->Get("/k", In(absl::Seconds(10)));
  EXPECT_TRUE(read.ok()) << read.status();
}

}  // namespace PST_FILE_ID
}  // namespace pst
