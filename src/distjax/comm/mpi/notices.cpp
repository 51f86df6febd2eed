// The MPI backend's notices between processes (see notices.hpp).
#include "distjax/comm/mpi/notices.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <sstream>
#include <utility>
#include <vector>

#include "distjax/comm/detail/call_desc.hpp"
#include "distjax/comm/mpi/flight_records.hpp"
#include "distjax/comm/mpi/watchdog.hpp"
#include "distjax/core/error.hpp"

namespace distjax::comm::mpi {

namespace {

using guards::Clock;

// A notice: a Head, the world ranks the sender failed on because they left it (int32
// each, padded to 8 bytes), how far it went on each of its groups (finished notices),
// then its message. At most kNoticeBytes, so that it travels eagerly (Open MPI's
// shared-memory eager limit is 4 KiB): a send completes without its receiver, which may
// have closed the epoch already.
constexpr int kNoticeBytes = 4096;
constexpr std::size_t kMaxBlamed = 64;
constexpr std::size_t kTextRoom = 1024;  // of a finished notice, for the message
enum class Kind : std::uint32_t { Abort = 1, Finished = 2 };
struct Head {
  Kind kind = Kind::Abort;
  std::uint32_t blamed = 0;
  std::uint32_t groups = 0;
  std::uint32_t text = 0;
};

std::size_t blamed_bytes(std::size_t n) {
  return (n * sizeof(std::int32_t) + 7) / 8 * 8;
}

struct Channel {
  MPI_Comm comm = MPI_COMM_NULL;  // private duplicate of MPI_COMM_WORLD
  int tag_ub = 32767;
  std::uint64_t epoch = 0;
  int device = 0, world = 1;
  MPI_Request recv = MPI_REQUEST_NULL;
  alignas(8) char buf[kNoticeBytes] = {};
  std::deque<std::vector<char>> sent;  // send buffers (kept alive: the sends are freed)

  // What arrived in this epoch.
  bool aborted = false;
  std::string notice;       // of the first abort notice: "device N failed: <its message>"
  std::vector<char> heard;  // per world rank: a notice came from it
  int heard_from = 0;
  std::map<int, std::vector<GroupCount>> finished;   // world rank -> how far it went
  std::vector<std::pair<int, std::string>> blamers;  // failed as this device left them

  // The devices this one failed on because they left it, and its message.
  std::vector<int> blamed;
  std::string blame_text;

  // The verdict on the awaited call, kept until what it was drawn from changes.
  std::uint64_t verdict_generation = ~std::uint64_t{0};
  std::size_t verdict_finished = 0;
  std::string verdict;
  std::vector<int> verdict_devices;

  int tag() const { return static_cast<int>(epoch % static_cast<std::uint64_t>(tag_ub)); }
};
Channel& channel() {
  static Channel* c = new Channel();  // never destroyed: used until MPI_Finalize
  return *c;
}

/// "device 3", "devices 0,2".
std::string devices(const std::vector<int>& v) {
  return (v.size() == 1 ? "device " : "devices ") + detail::join_ints(v);
}

std::vector<char> encode(Kind kind, const std::vector<int>& blamed,
                         const std::vector<GroupCount>& groups, const std::string& text) {
  Head h;
  h.kind = kind;
  h.blamed = static_cast<std::uint32_t>(std::min(blamed.size(), kMaxBlamed));
  h.groups = static_cast<std::uint32_t>(groups.size());
  const std::size_t fixed =
      sizeof(Head) + blamed_bytes(h.blamed) + groups.size() * sizeof(GroupCount);
  h.text = static_cast<std::uint32_t>(std::min(text.size(), kNoticeBytes - fixed));
  std::vector<char> out(fixed + h.text);
  char* p = out.data();
  std::memcpy(p, &h, sizeof(Head));
  p += sizeof(Head);
  for (std::uint32_t i = 0; i < h.blamed; ++i) {
    const auto r = static_cast<std::int32_t>(blamed[i]);
    std::memcpy(p + i * sizeof(r), &r, sizeof(r));
  }
  p += blamed_bytes(h.blamed);
  if (!groups.empty()) std::memcpy(p, groups.data(), groups.size() * sizeof(GroupCount));
  p += groups.size() * sizeof(GroupCount);
  std::memcpy(p, text.data(), h.text);
  return out;
}

/// Takes in the notice `len` bytes at ch.buf from world rank `src`.
void receive(int src, int len) {
  Channel& ch = channel();
  Head h;
  if (src < 0 || src >= ch.world || len < static_cast<int>(sizeof(Head))) return;
  std::memcpy(&h, ch.buf, sizeof(Head));
  const std::size_t fixed =
      sizeof(Head) + blamed_bytes(h.blamed) + std::size_t{h.groups} * sizeof(GroupCount);
  if (h.blamed > kMaxBlamed || fixed + h.text != static_cast<std::size_t>(len)) return;
  const char* p = ch.buf + sizeof(Head);
  bool blames_me = false;
  for (std::uint32_t i = 0; i < h.blamed; ++i) {
    std::int32_t r = 0;
    std::memcpy(&r, p + i * sizeof(r), sizeof(r));
    blames_me = blames_me || r == ch.device;
  }
  p += blamed_bytes(h.blamed);
  std::vector<GroupCount> groups(h.groups);
  if (h.groups > 0) std::memcpy(groups.data(), p, groups.size() * sizeof(GroupCount));
  p += groups.size() * sizeof(GroupCount);
  const std::string text(p, h.text);
  if (!ch.heard[src]) {
    ch.heard[src] = 1;
    ++ch.heard_from;
  }
  if (blames_me) ch.blamers.emplace_back(src, text);
  if (h.kind == Kind::Abort && !ch.aborted) {
    ch.aborted = true;
    ch.notice = "device " + std::to_string(src) + " failed: " + text;
  }
  if (h.kind == Kind::Finished) ch.finished[src] = std::move(groups);
}

void post_recv() {
  Channel& ch = channel();
  if (MPI_Irecv(ch.buf, kNoticeBytes, MPI_BYTE, MPI_ANY_SOURCE, ch.tag(), ch.comm, &ch.recv) !=
      MPI_SUCCESS)
    ch.recv = MPI_REQUEST_NULL;
}

/// Takes in every notice that has arrived (never blocks).
void drain() {
  Channel& ch = channel();
  while (ch.recv != MPI_REQUEST_NULL) {
    int flag = 0;
    MPI_Status st;
    const int rc = MPI_Test(&ch.recv, &flag, &st);
    if (rc == MPI_SUCCESS && !flag) return;
    if (rc == MPI_SUCCESS) {
      int len = 0;
      MPI_Get_count(&st, MPI_BYTE, &len);
      receive(st.MPI_SOURCE, len);
    }
    post_recv();
    if (rc != MPI_SUCCESS) return;
  }
}

void send_to_all(std::vector<char> msg) {
  Channel& ch = channel();
  ch.sent.push_back(std::move(msg));
  if (ch.sent.size() > 64) ch.sent.pop_front();  // long delivered (small, eager)
  const std::vector<char>& buf = ch.sent.back();
  for (int p = 0; p < ch.world; ++p) {
    if (p == ch.device) continue;
    MPI_Request r;
    if (MPI_Isend(buf.data(), static_cast<int>(buf.size()), MPI_BYTE, p, ch.tag(), ch.comm, &r) ==
        MPI_SUCCESS)
      MPI_Request_free(&r);
  }
}

/// A call's verdict: the devices of its group that finished without issuing it, or after
/// the group failed on them (they abandoned it); empty if none.
std::string call_verdict(const Awaited& a, std::vector<int>& leavers) {
  const Channel& ch = channel();
  const GroupRecords& g = *a.group;
  std::vector<int> missing, abandoned;
  std::vector<std::string> notes;
  for (int m : g.members) {
    const auto it = ch.finished.find(m);
    if (m == ch.device || it == ch.finished.end()) continue;
    const auto c = std::find_if(it->second.begin(), it->second.end(),
                                [&](const GroupCount& x) { return x.id == g.id; });
    if (c == it->second.end()) continue;  // left out of its notice: the timeout decides
    std::ostringstream os;
    os << "device " << m << " finished its program";
    if (c->issued <= a.seq) {
      missing.push_back(m);
      os << " after " << c->issued << " call" << (c->issued == 1 ? "" : "s") << " on this group";
    } else if (c->failed != 0) {
      abandoned.push_back(m);
      os << " after the group failed on it";
    } else {
      continue;  // it completed the call
    }
    notes.push_back(os.str());
  }
  if (missing.empty() && abandoned.empty()) return "";
  std::ostringstream os;
  os << "[" << op_kind_name(a.kind) << "] cannot complete call #" << a.seq << " of group "
     << g.label << ": ";
  if (!missing.empty()) os << devices(missing) << " did not arrive";
  if (!abandoned.empty())
    os << (missing.empty() ? "" : " and ") << devices(abandoned) << " left it unfinished";
  os << " (";
  for (std::size_t i = 0; i < notes.size(); ++i)
    os << (i ? "; " : "") << notes[i];
  os << ")";
  leavers = missing;
  leavers.insert(leavers.end(), abandoned.begin(), abandoned.end());
  return os.str();
}

/// A transfer's verdict: its peer finished.
std::string transfer_verdict(const Awaited& a, std::vector<int>& leavers) {
  const Channel& ch = channel();
  if (ch.finished.count(a.peer) == 0) return "";
  const bool send = a.kind == OpKind::Send;
  std::ostringstream os;
  os << "[" << (send ? "isend" : "irecv") << "] device " << ch.device
     << (send ? " sending to" : " receiving from") << " device " << a.peer << " with tag " << a.tag
     << " in group " << a.group->label << ": device " << a.peer
     << " finished its program without the matching " << (send ? "irecv" : "isend");
  leavers = {a.peer};
  return os.str();
}

}  // namespace

void open_epoch(std::chrono::milliseconds timeout, int device) {
  Channel& ch = channel();
  if (ch.comm == MPI_COMM_NULL) {
    guards::check(
        guards::guarded(timeout,
                        guards::blocked_message("launch", "MPI_Comm_dup(MPI_COMM_WORLD)", device,
                                                timeout, " while starting the MPI backend"),
                        [&] { return MPI_Comm_dup(MPI_COMM_WORLD, &ch.comm); }),
        "launch", device);
    MPI_Comm_set_errhandler(ch.comm, MPI_ERRORS_RETURN);
    int* ub = nullptr;
    int flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    if (flag && ub != nullptr && *ub > 0) ch.tag_ub = *ub;
  }
  MPI_Comm_size(ch.comm, &ch.world);
  ch.device = device;
  ch.epoch += 1;
  ch.aborted = false;
  ch.notice.clear();
  ch.heard.assign(static_cast<std::size_t>(ch.world), 0);
  ch.heard_from = 0;
  ch.finished.clear();
  ch.blamers.clear();
  ch.blamed.clear();
  ch.blame_text.clear();
  ch.verdict_generation = ~std::uint64_t{0};
  guards::check(
      MPI_Irecv(ch.buf, kNoticeBytes, MPI_BYTE, MPI_ANY_SOURCE, ch.tag(), ch.comm, &ch.recv),
      "launch", device);
  // The flight recorder's queries share the channel, with tags counted down from the
  // top (notices count up from 1), a pair per epoch.
  flight_open(ch.comm, ch.tag_ub - 2 - 2 * static_cast<int>(ch.epoch % 1000));
}

void close_epoch() {
  Channel& ch = channel();
  if (ch.recv != MPI_REQUEST_NULL) {
    MPI_Cancel(&ch.recv);
    MPI_Wait(&ch.recv, MPI_STATUS_IGNORE);
  }
  ch.aborted = false;
  ch.finished.clear();
  flight_close();
}

const std::string* poll_abort() {
  Channel& ch = channel();
  drain();
  return ch.aborted ? &ch.notice : nullptr;
}

const std::string* poll_left() {
  Channel& ch = channel();
  const Awaited& a = flight_awaited();
  if (ch.finished.empty() || a.group == nullptr) return nullptr;
  if (a.generation != ch.verdict_generation || ch.finished.size() != ch.verdict_finished) {
    ch.verdict_generation = a.generation;
    ch.verdict_finished = ch.finished.size();
    ch.verdict_devices.clear();
    ch.verdict =
        a.peer >= 0 ? transfer_verdict(a, ch.verdict_devices) : call_verdict(a, ch.verdict_devices);
  }
  return ch.verdict.empty() ? nullptr : &ch.verdict;
}

std::string left_failure() {
  Channel& ch = channel();
  for (int d : ch.verdict_devices)
    if (std::find(ch.blamed.begin(), ch.blamed.end(), d) == ch.blamed.end()) ch.blamed.push_back(d);
  if (ch.blame_text.empty()) ch.blame_text = ch.verdict;
  return ch.verdict;
}

void send_abort(const std::string& what) {
  Channel& ch = channel();
  if (ch.comm == MPI_COMM_NULL || ch.world == 1) return;
  if (poll_abort() != nullptr && ch.blamed.empty()) return;
  send_to_all(encode(Kind::Abort, ch.blamed, {}, what));
}

bool send_finished() {
  Channel& ch = channel();
  if (ch.comm == MPI_COMM_NULL || ch.world == 1) return false;
  flight_finished();
  const std::size_t room = kNoticeBytes - sizeof(Head) - blamed_bytes(kMaxBlamed) - kTextRoom;
  send_to_all(encode(Kind::Finished, ch.blamed, flight_counts(room / sizeof(GroupCount)),
                     ch.blame_text.substr(0, kTextRoom)));
  return true;
}

bool heard_from_all() {
  Channel& ch = channel();
  drain();
  return ch.heard_from == ch.world - 1;
}

void throw_if_blamed(int device) {
  Channel& ch = channel();
  if (ch.blamers.empty()) return;
  std::sort(ch.blamers.begin(), ch.blamers.end());
  std::vector<int> ranks;
  for (const auto& b : ch.blamers)
    ranks.push_back(b.first);
  std::ostringstream os;
  os << "[launch] device " << device << " finished its program while " << devices(ranks)
     << " waited on it (device " << ch.blamers.front().first << ": " << ch.blamers.front().second
     << ")";
  throw CommError(os.str());
}

}  // namespace distjax::comm::mpi
