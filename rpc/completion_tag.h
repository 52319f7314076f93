// Tags for gRPC's completion-queue API. Every operation started on a queue
// names a CompletionTag; whoever takes the operation's event from the
// queue runs the tag's Complete, on its own thread, with the event's `ok`.
//
// The data plane runs on this API rather than on gRPC's callback API: in
// the gRPC this is built with (1.51, epoll1), the callback API's events
// reach their reactors through a second completion queue drained by
// threads of gRPC's own, so every event costs a hand-off between threads,
// and those threads also take socket events from the process's other
// calls and hand them off too. A queue drained by the threads that wait on
// it has no such hop (docs/architecture.md, "One data call, on completion
// queues").
#ifndef PST_RPC_COMPLETION_TAG_H_
#define PST_RPC_COMPLETION_TAG_H_

namespace pst {

class CompletionTag {
 public:
  virtual void Complete(bool ok) = 0;

  // Runs the CompletionTag that `tag` (an event's tag) points to.
  static void Run(void* tag, bool ok) { static_cast<CompletionTag*>(tag)->Complete(ok); }

 protected:
  ~CompletionTag() = default;
};

// A tag that calls one member function of its owner.
template <typename Owner, void (Owner::*kMethod)(bool ok)>
class MemberTag final : public CompletionTag {
 public:
  explicit MemberTag(Owner* owner) : owner_(owner) {}
  void Complete(bool ok) override { (owner_->*kMethod)(ok); }

 private:
  Owner* const owner_;
};

}  // namespace pst

#endif  // PST_RPC_COMPLETION_TAG_H_
