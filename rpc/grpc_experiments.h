// gRPC's TCP transport as the data plane wants it.
//
// gRPC 1.51 (Debian 12's) ships leaner TCP reads as experiments, off unless
// the GRPC_EXPERIMENTS environment variable names them, which gRPC reads
// once, at its first use in a process:
//   tcp_frame_size_tuning  a read completes once the frame the transport
//                          expects has arrived, into a buffer of its size;
//   tcp_read_chunks        reads into fixed 8 or 64 KiB chunks, which the
//                          allocator recycles, not blocks of any size;
//   tcp_rcv_lowat          SO_RCVLOWAT, so a reader is not woken per packet.
// Beside the defaults in ps_bench they take less CPU per byte over TCP. Every binary that moves
// tensors over gRPC turns them on first thing in main, beside
// KeepLargeBuffersWarm (common/process_memory.h); the list is the build's
// (PST_GRPC_EXPERIMENTS in CMakeLists.txt), which the tests run with too.
#ifndef PST_RPC_GRPC_EXPERIMENTS_H_
#define PST_RPC_GRPC_EXPERIMENTS_H_

namespace pst {

// The experiments above, as GRPC_EXPERIMENTS names them.
const char* TransportExperiments();

// Sets GRPC_EXPERIMENTS to TransportExperiments() unless the environment
// already sets it (the user's choice wins, "" included). Call before the
// process first uses gRPC and before it starts a thread (setenv).
void EnableTransportExperiments();

}  // namespace pst

#endif  // PST_RPC_GRPC_EXPERIMENTS_H_
