// The states of one Exchange call (ps_server/service/exchange_call.h), and the
// transitions between them. A call is two machines that run side by side:
//
// ExchangePhase, where its request stands. The call's events and pool tasks
// drive it, one at a time:
//
//   kReadingHeader   -> kReadingPush      the first message is in
//   kReadingPush     -> kClaimingRegion   the request is whole: a shared exchange,
//                    -> kApplying         a TCP exchange that pushes,
//                    -> kPulling          a TCP pull alone
//   kClaimingRegion  -> kApplying         the region is the call's: the push,
//                    -> kPulling          or a pull alone
//   kApplying        -> kAwaitingTurn     the update must wait behind another
//                    -> kAnswered         applied: the push is the whole answer
//                    -> kPulling          applied: the answer is pulled
//   kAwaitingTurn    -> kApplying         woken: tried again
//   kPulling         -> kAwaitingVersion  the version is not there yet
//                    -> kAnswered         captured, and sent
//   kAwaitingVersion -> kPulling          woken: tried again
//
// An error, a cancel or the idle watchdog ends the call in whatever phase
// it is in: the phase then stays where it was, and only the wire moves on.
//
// ExchangeWire, where the call's side of the gRPC stream stands: the
// answer's messages go out one at a time, then the status, and the call is
// done once gRPC has reported every operation it started and no pool task
// runs for it (a waiter still parked holds a reference: the call is freed
// once it is dropped or woken):
//
//   kIdle        -> kWriting | kWritingLast | kFinishing | kDone
//   kWriting     -> kIdle
//   kWritingLast -> kFinishing
//   kFinishing   -> kDone
#ifndef PST_PS_SERVER_SERVICE_EXCHANGE_PHASE_H_
#define PST_PS_SERVER_SERVICE_EXCHANGE_PHASE_H_

namespace pst {

enum class ExchangePhase {
  kReadingHeader,    // nothing of the request taken yet
  kReadingPush,      // the header taken; a TCP push's pieces still arriving
  kClaimingRegion,   // the request whole: claiming the worker's region, or parked for it
  kApplying,         // the push is applied (staged out of the region first, if shared)
  kAwaitingTurn,     // the update waits behind another: a shard waiter, or a pool task
  kPulling,          // the push, if any, applied: the pull captures its variables
  kAwaitingVersion,  // the pull waits for its version: a shard waiter
  kAnswered,         // the answer is queued (or in the region): the call ends with OK
};

enum class ExchangeWire {
  kIdle,         // no write and no Finish in flight
  kWriting,      // the front message is being written
  kWritingLast,  // the last message is written with the status (WriteAndFinish)
  kFinishing,    // the status is sent, or on its way (Finish)
  kDone,         // gRPC has reported every operation: the call is over
};

// Whether the call may go from `from` to `to`.
bool CanEnter(ExchangePhase from, ExchangePhase to);
bool CanEnter(ExchangeWire from, ExchangeWire to);

const char* NameOf(ExchangePhase phase);
const char* NameOf(ExchangeWire wire);

// Aborts, naming the transition, unless CanEnter(from, to): a call that
// took another path than these would free itself twice, or never.
void CheckTransition(ExchangePhase from, ExchangePhase to);
void CheckTransition(ExchangeWire from, ExchangeWire to);

}  // namespace pst

#endif  // PST_PS_SERVER_SERVICE_EXCHANGE_PHASE_H_
