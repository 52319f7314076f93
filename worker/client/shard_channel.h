// The transport behind PsClient (worker/client/ps_client.h, whose contract
// it keeps): gRPC, the shared-memory path and the socket path, here and in
// the ps_client*.cc files alone. Nothing outside worker/client/ includes it.
//
// The channel knows where each variable lives (placement/placement.h) and
// speaks to all shards at once: one Pull, Push or PushPull here is one
// Exchange call per shard (proto/ps.proto), all in flight together on the
// client's completion queue, driven by the thread that waits for them
// (worker/client/shard_call.h, rpc/completion_driver.h), so no thread is made or
// held per call. A pull is an exchange with no gradients, a push one
// with no pull. The tensors are encoded straight from and decoded straight
// into the caller's buffers, in chunks of at most one chunk
// (common/tensor_stream.h) each way; a share of at most one chunk is one
// message each way. A shard on this host is offered a shared region
// instead (common/shared_memory.h): the exchange then carries only names,
// shapes, offsets and versions, and the tensors move through the region,
// where a caller may compute on them (AllocateTensors) so that nothing is
// copied on this side.
// Pull, PullRows, Push, PushRows and PushPull may not run concurrently with
// each other (one training loop per client); the other calls may.
//
// Embedding tables (SetEmbeddingTables) are addressed by 64-bit ids, their
// rows spread over every shard by placement/row_placement.h. A worker
// names per exchange, per table, the unique ids its batch touches
// (worker/client/row_split.h: RowGradients, RowValues); the client sends each
// shard its own ids, and the gradient rows for a push, in the same
// Exchange call that carries the dense tensors: inline in its headers over
// TCP, through the shard's region where it has one (and the shard reads
// rows there: ShmAttachResponse.rows_in_region), the answered rows coming
// back the same way; and it scatters the rows the shards answer back into
// the caller's order. A region keeps room for rows (kRowsRoomBytes) after
// its dense tensors; an exchange whose rows need more carries them inline,
// as over TCP. A shard's pulled rows that one call
// cannot carry (past the shard's --max_message_bytes or --max_reply_bytes,
// which Register learns) are pieced: what fits goes with the exchange, and
// the rest follows in pulls of rows alone, at the version the exchange
// answered (in SYNC the shard's version cannot move on before this worker
// pushes again, so every part reads the same step, unless
// replicas_to_aggregate lets steps land without it). Pushed rows are one
// update, never pieced (worker/client/row_split.h); a push whose rows are more
// than a shard takes in one request is refused before it is sent. Rows
// travel in the wire dtype. A
// model without tables pays nothing for them: every rows argument
// defaults to empty, and no row state is made.
#ifndef PST_WORKER_CLIENT_SHARD_CHANNEL_H_
#define PST_WORKER_CLIENT_SHARD_CHANNEL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/security.h"
#include "common/shared_memory.h"
#include "common/tensor_stream.h"
#include "common/thread_pool.h"
#include "common/transient_refusal.h"
#include "grpcpp/channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "placement/placement.h"
#include "placement/variable_spec.h"
#include "ps.grpc.pb.h"
#include "rpc/chunk_wire.h"
#include "rpc/completion_driver.h"
#include "worker/client/ps_client.h"
#include "worker/client/row_split.h"
#include "worker/client/shard_call.h"
#include "worker/client/step_exchange.h"

namespace pst {

class ShardChannel {
 public:
  // Opens channels to `addresses` (cluster.ps) and waits up to
  // `connect_timeout` for every shard to accept a connection, over the
  // channels `security` describes. Unavailable, naming the shard, if one
  // cannot be reached. `backups[s]`, if given, lists shard s's backups
  // (cluster.ps_backups): a shard is reached at any of its replicas, and
  // Register finds the one that is primary.
  static absl::StatusOr<std::unique_ptr<ShardChannel>> Connect(
      const std::vector<std::string>& addresses, int worker, absl::Duration connect_timeout,
      const ClusterSecurity& security = ClusterSecurity::Plaintext(),
      const std::vector<std::vector<std::string>>& backups = {});

  // How gradients and pulled parameters travel (default FLOAT32). Set it
  // before AllocateTensors.
  void set_wire_dtype(DType dtype) { wire_dtype_ = dtype; }

  // How long Init, Done and AwaitWorkersDone keep asking a shard that
  // refuses for now (IsTransientShardError: restarting, busy), backing off
  // with jitter between tries; 0 (a new client's): they fail at the first
  // refusal. Workers set training.pull_timeout_seconds.
  void set_call_patience(absl::Duration patience) { call_patience_ = patience; }

  // How tensors travel (cluster.shm). kAuto: through shared memory to every
  // shard that can open this host's regions, over TCP to the others (the
  // choice is logged once per shard); kTcp: over TCP; kShm: through shared
  // memory, and a shard that cannot share fails the call. A new client
  // uses kTcp; the trainer sets what cluster.shm says.
  using Transport = PsClient::Transport;
  void set_transport(Transport transport) { transport_ = transport; }
  // Whether shard s's tensors travel through shared memory (known once a
  // Pull, Push or PushPull has reached it).
  bool uses_shared_memory(int shard) const { return shards_[shard].region_attached; }

  int num_shards() const { return static_cast<int>(shards_.size()); }
  int worker() const { return worker_; }

  // Declares the model's variables, in order, and places them on the
  // shards as every process does (placement/placement.h: PlaceModel).
  void SetVariables(const std::vector<VariableSpec>& variables);

  // Declares the model's embedding tables (training.model.embeddings),
  // whose rows every shard holds a share of; Init declares them to the
  // shards. RowGradients and RowValues name a table by its index here.
  void SetEmbeddingTables(std::vector<EmbeddingTableConfig> tables) { tables_ = std::move(tables); }
  const std::vector<EmbeddingTableConfig>& embedding_tables() const { return tables_; }
  // The index of the table called `name`, or -1.
  int FindEmbeddingTable(absl::string_view name) const;

  // The placed slices of the model's variables.
  const std::vector<VariableSlice>& slices() const { return slices_; }

  // Memory for the model's tensors, one span per variable, sized like it.
  using Tensors = PsClient::Tensors;
  // Memory for every variable's gradient and values where the exchanges
  // read and write them: a variable that lies whole on a shard whose
  // tensors travel through shared memory (float32 on the wire) gets its
  // spans in that shard's region, so a Push or PushPull of them reads the
  // gradient where it lies and a Pull or PushPull leaves the values where
  // the caller reads them, with no copy on this side; the others get
  // memory of the client's own, which exchanges copy as any caller's.
  // Attaches the regions now (after SetVariables, set_transport and
  // set_wire_dtype). The spans stay valid, at the same addresses, for the
  // client's life, also across a shard's restart. Call once. Unavailable
  // if a shard cannot be reached; under kShm, FailedPrecondition if one
  // cannot share memory.
  absl::StatusOr<Tensors> AllocateTensors();

  // Registers with every shard, and learns each one's size limits; returns
  // shard 0's answer.
  absl::StatusOr<RegisterResponse> Register();

  // Offers initial values (one span per variable), and the embedding
  // tables, to every shard; a shard that already has values keeps them.
  // Returns whether shard 0 accepted. FailedPrecondition, before any call,
  // if the placement leaves a shard without a part (a model with fewer rows
  // in all than there are shards) and the model has no embedding table
  // (with one, such a shard holds only rows).
  absl::StatusOr<bool> Init(const std::vector<std::span<const float>>& values,
                            std::span<const RowGradients> initial_rows = {});
  // PsClient::SetDenseOptimizer and SetUpdateRates.
  void SetDenseOptimizer(std::optional<OptimizerConfig> optimizer) {
    dense_optimizer_ = std::move(optimizer);
  }
  absl::Status SetUpdateRates(const std::optional<UpdateRates>& rates);

  // Pulls every variable into `out` (one span per variable, sized like the
  // variable), and the values of the rows `rows` names, waiting on shard s
  // until its version is >= min_versions[s] for at most `timeout`. Fills
  // `versions` with each shard's version. Every rows argument is checked
  // before anything is sent: InvalidArgument for an unknown table, a table
  // named twice, an id twice in one table's ids, or a span whose length is
  // not ids x dim.
  absl::Status Pull(const std::vector<int64_t>& min_versions, absl::Duration timeout,
                    const std::vector<std::span<float>>& out, std::vector<int64_t>* versions,
                    std::span<const RowValues> rows = {});

  // Pulls the values of the rows `rows` names, and no dense variable, as
  // Pull does.
  absl::Status PullRows(const std::vector<int64_t>& min_versions, absl::Duration timeout,
                        std::span<const RowValues> rows, std::vector<int64_t>* versions);

  // Pushes one gradient per variable, and the row gradients `rows`, as one
  // update; shard s's gradients are tagged with computed_at[s]. Fills
  // `responses` with each shard's answer. With embedding tables, every
  // shard's push names every table (with no ids where the batch has none
  // of its rows), so every shard counts the step.
  absl::Status Push(const std::vector<int64_t>& computed_at,
                    const std::vector<std::span<const float>>& gradients,
                    std::vector<PushResponse>* responses,
                    std::span<const RowGradients> rows = {});

  // Pushes row gradients alone, no dense gradient (ASYNC and SSP; SYNC
  // shards that hold dense variables refuse it, every SYNC push carrying
  // every variable's gradient).
  absl::Status PushRows(const std::vector<int64_t>& computed_at, std::span<const RowGradients> rows,
                        std::vector<PushResponse>* responses);

  // A training step's exchange in one call per shard: pushes the gradients
  // as Push does, then fills `out` and `versions` as Pull does, with values
  // that include this push, at versions of at least min_versions. On an
  // ASYNC shard, the shard sends each chunk's new values back while the
  // rest of the push is still on its way, so the two directions of the
  // connection are busy at once. `gradients` and `out` must not overlap.
  // `rows`: step s's row gradients go with the push, and step s+1's rows
  // come back with the values (StepRows), all in the same round trip.
  absl::Status PushPull(const std::vector<int64_t>& computed_at,
                        const std::vector<std::span<const float>>& gradients,
                        const std::vector<int64_t>& min_versions, absl::Duration timeout,
                        const std::vector<std::span<float>>& out, std::vector<int64_t>* versions,
                        std::vector<PushResponse>* responses, const StepRows& rows = {});

  // A training step's exchange fed layer by layer (worker/client/step_exchange.h):
  // one exchange per shard, whatever the share's size. Gradients
  // are pushed as Push pushes them, in `push_order` (every variable once,
  // the order StepExchange::Push will be called in), tagged as PushPull
  // tags them; the values come back into `out` in variable order, at
  // versions of at least min_versions. `gradients` and `out` must not
  // overlap, and must stay valid until the exchange is finished or gone.
  // `rows` as PushPull's: the row gradients go in each shard's first
  // message, so they must be final when the first StepExchange::Push is
  // called (a model whose row gradients come last in backward pushes every
  // variable in one Push, or uses PushPull); the pulled rows are in their
  // spans once Finish returns OK. The spans must stay valid as `out`.
  absl::StatusOr<std::unique_ptr<StepExchange>> BeginExchange(
      const std::vector<int64_t>& computed_at,
      const std::vector<std::span<const float>>& gradients, const std::vector<int>& push_order,
      const std::vector<int64_t>& min_versions, absl::Duration timeout,
      const std::vector<std::span<float>>& out, const StepRows& rows = {});

  // Tells every shard this worker is alive (it may be computing a long step).
  absl::Status Heartbeat();
  // One shard's heartbeat: also the stack's smallest round trip.
  absl::Status Heartbeat(int shard);

  // Tells every shard this worker has finished: its primary, then each
  // backup (OK where any replica took it).
  absl::Status Done();

  // The Stats of shard `shard`'s primary: the replica last found if it
  // answers as one, else whichever replica answers as primary at the
  // highest epoch (while none does, during a failover, the one at the
  // highest epoch answers). `answered_by` (if set) gets its address.
  absl::StatusOr<StatsResponse> Stats(int shard, std::string* answered_by = nullptr);
  // Shard `shard`'s Stats once every worker is done, or the workers'
  // standing differs from `known_changes` (the worker_changes of the last
  // answer; -1 for none), or `timeout` has passed: a long-poll, so the
  // chief learns of each change as it happens without polling.
  absl::StatusOr<StatsResponse> AwaitWorkersDone(int shard, int64_t known_changes,
                                                 absl::Duration timeout);

  // Admin calls, one shard at a time: a checkpoint at its primary (as
  // Stats finds it); a shutdown of every replica (OK if any took it).
  absl::StatusOr<CheckpointResponse> Checkpoint(int shard);
  absl::Status Shutdown(int shard);
  // Where shard `shard` is called now: its primary as last found.
  const std::string& address(int shard) const;

 private:
  struct Endpoint {
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<ParameterServer::Stub> stub;
    // Exchange, called with byte-buffer messages (rpc/chunk_wire.h)
    // instead of through the stub.
    std::unique_ptr<grpc::GenericStub> generic;
  };
  struct Shard {
    // One per replica (0: cluster.ps), made at Connect and kept for the
    // client's life, so a call in flight never outlives its stub; `at`
    // (guarded by endpoint_mu_) is the one calls go to, the primary as
    // Register last found it.
    std::vector<std::unique_ptr<Endpoint>> endpoints;
    int at = 0;
    // This worker's pushes the shard has taken (RegisterResponse.worker_clock,
    // then one more for each push it answered): the next push's sequence,
    // by which a push sent again after a failover is not applied twice.
    // -1 until the first Register.
    int64_t pushes = -1;
    // The version the shard's new primary held when Register found it
    // (-1: no failover since the last whole exchange). A read of the old
    // primary may have shown updates it had not yet replicated (ASYNC), so
    // a push sent again claims at most this version.
    int64_t version_after_failover = -1;
    // The epoch of the primary this worker last registered with (-1: none
    // yet). A new one at the same place is a failover too: the replica
    // restarted there took the office, perhaps from its checkpoint.
    int64_t epoch = -1;
    // How long Register waits for one replica of a replicated shard: short,
    // so that a new primary is found within a fraction of a second; doubled
    // each time a replica lets it run out, back to the shortest on an answer.
    absl::Duration register_wait = kShortestRegisterWait;
    std::vector<size_t> slices;  // indices into slices_, in order
    // The last exchange's call, which gRPC may still be finishing after
    // its answer arrived; replaced (and so waited for) by the next one.
    std::unique_ptr<ShardCall> finishing;
    // 16-bit wire types: gradients encoded for a push, a piece received
    // for decoding. Reused by every exchange.
    std::vector<char> encoded;
    std::string received;
    // Shared memory with this shard: the region and the shard's handle for
    // it while attached; `shm_refused` once the shard has said it cannot.
    // A region that holds the caller's tensors (AllocateTensors) is kept
    // for the client's life, renewed when the shard has lost it.
    std::unique_ptr<SharedRegion> region;
    uint64_t region_handle = 0;
    // The region's layout: the gradients from 0 and the answer's values
    // from dense_room, each dense_room bytes; the rest, from 2 x
    // dense_room, is room for embedding rows, used where the shard reads
    // them there (rows_in_region, said by its ShmAttach answer).
    int64_t dense_room = 0;
    bool rows_in_region = false;
    bool region_attached = false;
    bool tensors_in_region = false;
    bool shm_refused = false;
    bool shm_logged = false;
    // The shard's size limits, from Register's answer (0: not known, and
    // nothing is pieced or refused for them).
    int64_t max_request_bytes = 0;
    int64_t max_reply_bytes = 0;
    int64_t max_rows_per_pull = 0;
    // What SetUpdateRates gave this shard's pushes.
    std::optional<UpdateRates> rates;
  };
  explicit ShardChannel(int worker) : worker_(worker) {}

  Endpoint& endpoint(int shard) const;
  // One replica's Done; `primary_version` for a backup, as
  // DoneRequest.primary_version.
  absl::StatusOr<DoneResponse> DoneAt(int shard, int place, std::optional<int64_t> primary_version,
                                      absl::Duration deadline) const;
  // One replica's Stats; Stats' search for the primary.
  absl::StatusOr<StatsResponse> StatsAt(int shard, int place, absl::Duration deadline) const;
  struct PrimaryStats {
    int place;  // in Shard::endpoints
    StatsResponse stats;
  };
  absl::StatusOr<PrimaryStats> StatsOfPrimary(int shard) const;
  // Register with shard s at its current endpoint; where that one is away
  // or not primary, with its other replicas in turn, moving to the first
  // that takes it.
  absl::Status RegisterFollowing(int s, RegisterResponse* response);
  absl::Status RegisterAt(int s, int place, absl::Duration deadline, RegisterResponse* response);
  // A push's header for shard s: computed_at and the push's sequence.
  void TagPush(int s, int64_t computed_at, PushRequest* header) const;
  // `exchange`, the status of an exchange that pushed to every shard;
  // counts its pushes where it succeeded.
  absl::Status PushesAnswered(absl::Status exchange);

  // Deadline for calls that should answer at once; long-polls add their wait.
  static constexpr absl::Duration kRpcDeadline = absl::Seconds(60);
  static constexpr absl::Duration kShortestRegisterWait = absl::Milliseconds(300);
  // Calls to the replicas other than the one last found (which is primary
  // now, Stats; a Done each is told): a replica cut off answers nothing,
  // and the others may.
  static constexpr absl::Duration kReplicaStatsDeadline = absl::Seconds(5);
  // A region's room for embedding rows (a model with tables): an exchange's
  // pushed ids and rows, pulled ids and answered rows. Every page of a
  // region is allocated as it is made, so the room is bounded; rows past it
  // travel inline, as over TCP. Bounded too by what the shard takes
  // (max_request_bytes + max_reply_bytes, its largest region) once known.
  static constexpr int64_t kRowsRoomBytes = int64_t{8} << 20;
  // How long a push waits, after the call, for gRPC to drop its references
  // to the caller's gradients (at once, unless a failed call left bytes
  // queued on a stuck connection).
  static constexpr absl::Duration kReleaseTimeout = absl::Seconds(10);
  // A unary call's context: its deadline, `from_now`, and this process's
  // session (rpc/worker_session.h).
  static void PrepareContext(grpc::ClientContext* context, absl::Duration from_now);

  // Runs call(s) for every shard s concurrently and waits for all; the first
  // failure, prefixed with the shard's name, is returned.
  absl::Status ForEachShard(absl::FunctionRef<absl::Status(int)> call);
  // Runs `call` (one try of one shard's unary call) until it does not fail
  // with a transient refusal, within call_patience_.
  absl::Status Patiently(absl::FunctionRef<absl::Status()> call);
  // `status` as a shard's answer: its message prefixed with the shard's
  // name, and marked for NamesItsShard and IsTransientShardError.
  absl::Status ShardError(int shard, const grpc::Status& status) const;
  absl::Status ShardError(int shard, const absl::Status& status) const;
  // Bytes shard s's slices take on the wire.
  int64_t WireBytes(int shard) const;

  // One shard's part of Pull, Push or PushPull: a push of `gradients` if
  // given (tagged `computed_at`), then `pull` if given, its answer decoded
  // into `out`, its version into `version`; `response` gets what became of
  // the push. `rows`, if given, holds the exchange's rows: shard s's pushed
  // rows go in its header, its pulled ids are in `pull` already, and the
  // rows it answers are taken into the caller's spans. `rows_part`: which
  // part of the shard's pieced pull this exchange carries; only part 0
  // carries the pushed rows.
  struct ShardExchange {
    int shard = 0;
    int rows_part = 0;
    int64_t computed_at = 0;
    const std::vector<std::span<const float>>* gradients = nullptr;
    RowSplit* rows = nullptr;
    std::optional<PullRequest> pull;
    const std::vector<std::span<float>>* out = nullptr;
    int64_t* version = nullptr;
    PushResponse* response = nullptr;
  };
  // An answer being read from one shard.
  struct StreamedAnswer {
    std::optional<PieceSequence> sequence;  // set up by the header
    std::vector<size_t> order;      // answer tensor -> position in the shard's slices
    std::vector<int64_t> received;  // bytes of each answer tensor so far
    int64_t version = 0;            // the header's: 0 where the answer streams during the push
    bool rows_only = false;         // the pull asked for rows and no variable
    PullResponse header;            // its dense values lie in the pieces or the region
    std::optional<ExchangeDone> done;
  };
  // An exchange started and not yet waited for.
  struct OpenExchange {
    bool shared = false;
    int64_t answer_offset = 0;
    // The rows went through the region, and the answer's rows lie there
    // from rows_answer_offset.
    bool rows_in_region = false;
    int64_t rows_answer_offset = 0;
    StreamedAnswer answer;
    // Counts gRPC's references to the pushed bytes (the caller's memory or
    // shard.encoded).
    PayloadPin sent = std::make_shared<char>(0);
    std::unique_ptr<ShardCall> call;
  };
  // Runs `exchanges` (one per shard at most) at once and waits for all;
  // the first failure is returned. Once one shard's part has failed, the
  // others' are cancelled rather than awaited.
  absl::Status RunExchanges(const std::vector<ShardExchange>& exchanges);
  // Waits until `open[part]` is answered or any part of `open` has failed
  // (a region-lost refusal aside: FinishExchange sends that part again);
  // returns the part that failed, if one did.
  std::optional<size_t> AwaitPartOrFailure(const std::vector<std::unique_ptr<OpenExchange>>& open,
                                           size_t part);
  // The exchange's rows split by shard; nullopt where it has none (and, for
  // a push, the model no table). `pushes`: the exchange pushes.
  absl::StatusOr<std::optional<RowSplit>> SplitRows(std::span<const RowGradients> push,
                                                    std::span<const RowValues> pull,
                                                    bool pushes) const;
  // After the exchange that carried part 0 of `split`'s pulled rows: pulls
  // the further parts, rows only, at `versions` (the exchange's answer).
  absl::Status PullRemainingRows(RowSplit* split, const std::vector<int64_t>& versions,
                                 absl::Duration timeout);
  // Prepares exchanges[s] (shard s's, `pull` set if it pulls) to carry
  // `split`'s rows.
  static void AttachRows(std::optional<RowSplit>& split, std::vector<ShardExchange>* exchanges);
  // Starts `exchange` over shard s's region (`shared`) or its socket.
  std::unique_ptr<OpenExchange> StartExchange(const ShardExchange& exchange, bool shared);
  // Waits for `open` and takes its answer. A shard that no longer knows
  // the shared region (it restarted) is offered a new one and called again,
  // if `may_attach_again`.
  absl::Status FinishExchange(const ShardExchange& exchange, OpenExchange* open,
                              bool may_attach_again = true);
  // A pull of this worker's at least `min_version`, waiting up to `timeout`,
  // in the wire dtype; the caller adds the variables' names if it wants them.
  // A read of shard s from min_version (at most the step after a new
  // primary's version, until the next whole exchange).
  PullRequest MakePullRequest(int s, int64_t min_version, absl::Duration timeout) const;
  // Checks a pull's header against what shard s should hold: its slices,
  // in any order, which `order` gets; none for a pull of rows only.
  absl::Status CheckPullHeader(int shard, const PullResponse& header, bool rows_only,
                               std::vector<size_t>* order) const;
  // Takes one answer message of shard s into `out` (socket answers) or
  // `answer->header` (shared ones): the first sets up `answer` from its
  // header, every one's pieces must follow it, and the last carries `done`.
  // `completed`, if given, gets the position (in the shard's slices) of
  // every slice whose values this message completed.
  absl::Status TakeAnswer(int shard, grpc::ByteBuffer* message, bool shared,
                          const std::vector<std::span<float>>* out, StreamedAnswer* answer,
                          std::vector<size_t>* completed = nullptr);
  // Takes the pieces of a parsed answer message into `out`.
  absl::Status TakePullChunk(int shard, const ReceivedChunk& chunk,
                             const std::vector<std::span<float>>& out, StreamedAnswer* answer,
                             std::vector<size_t>* completed);
  // Sends shard s's gradients as exchange messages through `write`: the
  // slices at positions [first, end) of `header_order` (the exchange's
  // tensors, as slice indices), referencing the caller's memory (float32)
  // or shard.encoded, each piece counted in `sent`. The exchange's first
  // message (first == 0) carries the header, with `rows` if given, and
  // `pull` if given; the last slice's last message ends the request. False
  // if a write failed (the call ended early).
  bool WritePushChunks(int shard, int64_t computed_at,
                       const std::vector<std::span<const float>>& gradients,
                       const std::vector<size_t>& header_order, size_t first, size_t end,
                       const PullRequest* pull, EmbeddingRowsList* rows, const PayloadPin& sent,
                       absl::FunctionRef<bool(grpc::ByteBuffer, bool last)> write);
  // Whether shard s's tensors go through shared memory: attaches a region
  // the first time (and again after the shard has lost it). An error only
  // where the call must fail (kShm refused, the shard unreachable).
  absl::StatusOr<bool> UseSharedMemory(int shard);
  // Offers shard s's region, as ShmAttach's answer or a refusal: a sealed
  // region is handed over the shard's socket, and one that cannot be (a
  // shard in another network namespace, or one without the socket) moves
  // to a named object and is offered by name.
  grpc::Status OfferRegion(int shard, const std::string& boot_id, uint64_t* handle);
  // After a failed shared exchange: the shard may still be reading the push
  // (its staging races with the call's cancellation), so shard s's region
  // moves to private memory at the same address (SharedRegion::Detach),
  // shared again in a new object by the next exchange; the caller's next
  // gradient never lands in memory the shard reads. `failure` is
  // returned, with the reason if the move failed too.
  absl::Status LeaveRegionAfterFailure(int shard, absl::Status failure);
  // The request of a shared exchange: the gradients encoded into shard s's
  // region (unless they lie there already), their names, shapes and
  // offsets in the message; the rows, in the region where they fit its
  // room and the shard reads them there, else inline.
  grpc::ByteBuffer SharedRequest(const ShardExchange& exchange, OpenExchange* open);
  // Writes the exchange's rows (`push`, and `pull`'s ids) into shard s's
  // rows room and says where in `transfer`, leaving in `header` and `pull`
  // their tables only; false, with nothing changed, where they do not fit.
  bool PlaceRowsInRegion(int shard, const EmbeddingRowsList* push, int64_t answer_bytes,
                         PushRequest* header, PullRequest* pull, ShmTransfer* transfer);
  // Decodes a shared answer out of shard s's region into `out` (nothing to
  // copy for a span that lies where its values are).
  absl::Status TakeSharedAnswer(const ShardExchange& exchange, const OpenExchange& open);
  // Waits until gRPC has dropped every reference `sent` counts, running
  // the queue's events meanwhile.
  void AwaitPushReleased(int shard, const PayloadPin& sent);

  friend class LayerwiseExchange;

  int worker_;
  absl::Duration call_patience_ = absl::ZeroDuration();
  DType wire_dtype_ = FLOAT32;
  Transport transport_ = Transport::kTcp;
  // The exchanges' queue; before shards_, whose finishing calls it drives
  // as they are destroyed.
  CompletionDriver driver_;
  std::vector<Shard> shards_;
  mutable absl::Mutex endpoint_mu_;  // Shard::at: heartbeats and Stats may run beside a Register
  std::vector<VariableSlice> slices_;
  std::vector<std::string> variable_names_;  // of SetVariables, by index
  std::vector<EmbeddingTableConfig> tables_;
  std::optional<OptimizerConfig> dense_optimizer_;
  // AllocateTensors' memory for the tensors outside every region.
  std::vector<std::vector<float>> own_tensors_;
  // Where the control calls (Register, Init, Heartbeat, Done) of shards
  // 1..N-1 are made from.
  ThreadPool threads_;
};

}  // namespace pst

#endif  // PST_WORKER_CLIENT_SHARD_CHANNEL_H_
