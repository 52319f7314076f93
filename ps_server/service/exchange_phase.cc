#include "ps_server/service/exchange_phase.h"

#include <cstdio>
#include <cstdlib>

namespace pst {
namespace {

template <typename State>
[[noreturn]] void Illegal(State from, State to) {
  std::fprintf(stderr, "exchange call: illegal transition %s -> %s\n", NameOf(from), NameOf(to));
  std::abort();
}

}  // namespace

bool CanEnter(ExchangePhase from, ExchangePhase to) {
  using enum ExchangePhase;
  switch (from) {
    case kReadingHeader:
      return to == kReadingPush;
    case kReadingPush:
      return to == kClaimingRegion || to == kApplying || to == kPulling;
    case kClaimingRegion:
      return to == kApplying || to == kPulling;
    case kApplying:
      return to == kAwaitingTurn || to == kPulling || to == kAnswered;
    case kAwaitingTurn:
      return to == kApplying;
    case kPulling:
      return to == kAwaitingVersion || to == kAnswered;
    case kAwaitingVersion:
      return to == kPulling;
    case kAnswered:
      return false;
  }
  return false;
}

bool CanEnter(ExchangeWire from, ExchangeWire to) {
  using enum ExchangeWire;
  switch (from) {
    case kIdle:
      return to == kWriting || to == kWritingLast || to == kFinishing || to == kDone;
    case kWriting:
      return to == kIdle;
    case kWritingLast:
      return to == kFinishing;
    case kFinishing:
      return to == kDone;
    case kDone:
      return false;
  }
  return false;
}

const char* NameOf(ExchangePhase phase) {
  using enum ExchangePhase;
  switch (phase) {
    case kReadingHeader: return "ReadingHeader";
    case kReadingPush: return "ReadingPush";
    case kClaimingRegion: return "ClaimingRegion";
    case kApplying: return "Applying";
    case kAwaitingTurn: return "AwaitingTurn";
    case kPulling: return "Pulling";
    case kAwaitingVersion: return "AwaitingVersion";
    case kAnswered: return "Answered";
  }
  return "?";
}

const char* NameOf(ExchangeWire wire) {
  using enum ExchangeWire;
  switch (wire) {
    case kIdle: return "Idle";
    case kWriting: return "Writing";
    case kWritingLast: return "WritingLast";
    case kFinishing: return "Finishing";
    case kDone: return "Done";
  }
  return "?";
}

void CheckTransition(ExchangePhase from, ExchangePhase to) {
  if (!CanEnter(from, to)) Illegal(from, to);
}

void CheckTransition(ExchangeWire from, ExchangeWire to) {
  if (!CanEnter(from, to)) Illegal(from, to);
}

}  // namespace pst
