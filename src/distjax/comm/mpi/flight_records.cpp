// The MPI backend's flight recorder and its query service (see flight_records.hpp).
#include "distjax/comm/mpi/flight_records.hpp"

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <sstream>

#include "distjax/comm/mpi/backoff.hpp"
#include "distjax/comm/mpi/hosts.hpp"

namespace distjax::comm::mpi {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kKeyBytes = 64;
constexpr int kWhereBytes = 160;

struct Query {
  std::uint64_t seq = 0;
  char key[kKeyBytes] = {};
};
struct Reply {
  std::uint64_t seq = 0;  // echo of the query
  std::uint64_t issued = 0;
  std::uint8_t knows_group = 0, has_desc = 0;
  char key[kKeyBytes] = {};  // echo of the query
  detail::CallDesc desc;
  char where[kWhereBytes] = {};
};

struct Service {
  MPI_Comm comm = MPI_COMM_NULL;
  int tag = 0;
  MPI_Request recv = MPI_REQUEST_NULL;
  Query in;
  std::deque<Reply> sent;     // buffers of replies in flight (freed requests)
  std::deque<Query> queries;  // buffers of queries in flight (freed requests)
  std::map<std::string, int> created;  // groups per label in this launch
  std::vector<std::weak_ptr<GroupRecords>> groups;
  std::vector<GroupCount> retired;  // groups of this launch destroyed, oldest first
  std::vector<std::shared_ptr<GroupRecords>> kept;  // their records, for answers
  Awaited waiting;
  bool finished = false;  // the device's program returned
  // Guards `waiting`, `finished` and the records `waiting` points to against readers on
  // other threads (flight_describe_wait); only the device's thread writes them.
  std::mutex m;
};
Service& service() {
  static Service* s = new Service();  // never destroyed: used until MPI_Finalize
  return *s;
}

void copy_key(char* dst, const std::string& key) {
  std::strncpy(dst, key.c_str(), kKeyBytes - 1);
  dst[kKeyBytes - 1] = 0;
}

std::string where_text() {
  const Service& s = service();
  const Awaited& a = s.waiting;
  if (s.finished) return "finished its program";
  if (a.group == nullptr) return "is not in a communicator call";
  std::ostringstream os;
  if (a.peer >= 0) {
    os << "is in " << (a.kind == OpKind::Send ? "isend to" : "irecv from") << " device " << a.peer
       << " (tag " << a.tag << ") in group " << a.group->label;
  } else {
    os << "is in " << op_kind_name(a.kind) << " call #" << a.seq << " of group " << a.group->label;
  }
  return os.str();
}

GroupCount count_of(const GroupRecords& g) {
  return {.id = g.id, .issued = g.issued, .failed = g.failed ? 1u : 0u};
}

Reply answer(const Query& q) {
  Service& s = service();
  Reply r;
  r.seq = q.seq;
  std::memcpy(r.key, q.key, kKeyBytes);
  auto look = [&](const GroupRecords& g) {
    if (std::strncmp(g.key.c_str(), q.key, kKeyBytes) != 0) return;
    r.knows_group = 1;
    r.issued = g.issued;
    if (q.seq < g.issued && q.seq + GroupRecords::kKeep >= g.issued) {
      r.has_desc = 1;
      r.desc = g.last[q.seq % GroupRecords::kKeep];
    }
  };
  for (auto& w : s.groups)
    if (auto g = w.lock()) look(*g);
  for (const auto& g : s.kept)
    look(*g);
  std::string w = where_text();
  std::strncpy(r.where, w.c_str(), kWhereBytes - 1);
  return r;
}

void post_recv() {
  Service& s = service();
  MPI_Irecv(&s.in, sizeof(Query), MPI_BYTE, MPI_ANY_SOURCE, s.tag, s.comm, &s.recv);
}

}  // namespace

std::shared_ptr<GroupRecords> flight_register(const std::string& label,
                                              const std::vector<int>& members) {
  Service& s = service();
  auto g = std::make_shared<GroupRecords>();
  g->label = label;
  g->members = members;
  const int k = s.created[label]++;
  // Labels of large groups are long; the key only has to be unique and agreed on.
  g->key = std::to_string(std::hash<std::string>{}(label)) + "#" + std::to_string(k);
  g->id = std::hash<std::string>{}(g->key);
  std::erase_if(s.groups, [](const std::weak_ptr<GroupRecords>& w) { return w.expired(); });
  s.groups.push_back(g);
  return g;
}

void flight_retire(const std::shared_ptr<GroupRecords>& g) {
  Service& s = service();
  s.retired.push_back(count_of(*g));
  // Out of the live list (flight_counts counts it once, as retired), into the kept one.
  std::erase_if(s.groups, [&](const std::weak_ptr<GroupRecords>& w) {
    auto live = w.lock();
    return !live || live == g;
  });
  s.kept.push_back(g);
}

std::vector<GroupCount> flight_counts(std::size_t max) {
  const Service& s = service();
  std::vector<GroupCount> out;
  for (const auto& w : s.groups)
    if (auto g = w.lock(); g && out.size() < max) out.push_back(count_of(*g));
  for (auto it = s.retired.rbegin(); it != s.retired.rend() && out.size() < max; ++it)
    out.push_back(*it);
  return out;
}

void flight_waiting(const Awaited& a) {
  Service& s = service();
  std::lock_guard<std::mutex> lk(s.m);
  const std::uint64_t generation = s.waiting.generation + 1;
  s.waiting = a;
  s.waiting.generation = generation;
}

const Awaited& flight_awaited() {
  return service().waiting;
}

std::string flight_describe_wait() {
  Service& s = service();
  std::lock_guard<std::mutex> lk(s.m);
  const Awaited& a = s.waiting;
  if (s.finished || a.group == nullptr) return "";
  std::ostringstream os;
  if (a.peer >= 0)
    os << "[" << (a.kind == OpKind::Send ? "isend" : "irecv") << "] transfer "
       << (a.kind == OpKind::Send ? "to" : "from") << " device " << a.peer << " (tag " << a.tag
       << ") in group " << a.group->label;
  else
    os << "[" << op_kind_name(a.kind) << "] call #" << a.seq << " of group " << a.group->label;
  return os.str();
}

void flight_finished() {
  Service& s = service();
  std::lock_guard<std::mutex> lk(s.m);
  s.finished = true;
}

void flight_open(MPI_Comm comm, int query_tag) {
  Service& s = service();
  flight_waiting({});  // before the records it may point to go
  std::lock_guard<std::mutex> lk(s.m);
  s.comm = comm;
  s.tag = query_tag;
  s.created.clear();
  s.groups.clear();
  s.retired.clear();
  s.kept.clear();
  s.finished = false;
  post_recv();
}

void flight_close() {
  Service& s = service();
  if (s.recv != MPI_REQUEST_NULL) {
    MPI_Cancel(&s.recv);
    MPI_Wait(&s.recv, MPI_STATUS_IGNORE);
  }
  flight_waiting({});
}

void flight_serve() {
  Service& s = service();
  for (;;) {
    if (s.recv == MPI_REQUEST_NULL) return;
    int flag = 0;
    MPI_Status st;
    if (MPI_Test(&s.recv, &flag, &st) != MPI_SUCCESS || !flag) return;
    s.sent.push_back(answer(s.in));
    if (s.sent.size() > 256) s.sent.pop_front();  // long delivered (small, eager)
    MPI_Request r;
    if (MPI_Isend(&s.sent.back(), sizeof(Reply), MPI_BYTE, st.MPI_SOURCE, s.tag + 1, s.comm,
                  &r) == MPI_SUCCESS)
      MPI_Request_free(&r);
    post_recv();
  }
}

std::vector<PeerRecord> flight_query(const GroupRecords& g, std::uint64_t seq,
                                     const std::vector<int>& peers, Clock::time_point until,
                                     bool (*peer_failed)()) {
  Service& s = service();
  std::vector<PeerRecord> out(peers.size());
  if (s.comm == MPI_COMM_NULL) return out;
  s.queries.emplace_back();
  if (s.queries.size() > 256) s.queries.pop_front();  // long delivered (small, eager)
  Query& q = s.queries.back();
  q.seq = seq;
  copy_key(q.key, g.key);
  std::vector<Reply> replies(peers.size());
  std::vector<MPI_Request> reqs(peers.size(), MPI_REQUEST_NULL);
  for (std::size_t i = 0; i < peers.size(); ++i) {
    MPI_Irecv(&replies[i], sizeof(Reply), MPI_BYTE, peers[i], s.tag + 1, s.comm, &reqs[i]);
    MPI_Request r;
    if (MPI_Isend(&q, sizeof(Query), MPI_BYTE, peers[i], s.tag, s.comm, &r) == MPI_SUCCESS)
      MPI_Request_free(&r);
  }
  std::vector<int> done(peers.size(), 0);
  Backoff backoff;
  for (const auto start = Clock::now();;) {
    bool all = true;
    for (std::size_t i = 0; i < peers.size(); ++i) {
      if (!done[i]) MPI_Test(&reqs[i], &done[i], MPI_STATUS_IGNORE);
      all = all && done[i];
    }
    flight_serve();  // a peer diagnosing at the same time asks us too
    const auto now = Clock::now();
    // A peer that failed answers no more (its epoch is closed), and its abort notice, sent
    // before it closed, says why: waiting out the grace for it would only delay the failure.
    if (all || now > until || (peer_failed && peer_failed())) break;
    backoff.pause(start, now);
  }
  for (std::size_t i = 0; i < peers.size(); ++i) {
    if (!done[i]) {  // a late answer must not land in `replies` after we return
      MPI_Cancel(&reqs[i]);
      MPI_Wait(&reqs[i], MPI_STATUS_IGNORE);
      continue;
    }
    const Reply& r = replies[i];
    if (r.seq != seq || std::strncmp(r.key, q.key, kKeyBytes) != 0) continue;  // stale
    PeerRecord& p = out[i];
    p.answered = true;
    p.knows_group = r.knows_group != 0;
    p.issued = r.issued;
    p.has_desc = r.has_desc != 0;
    p.desc = r.desc;
    p.where = std::string(r.where, strnlen(r.where, kWhereBytes));
  }
  return out;
}

std::string silent_hosts(const GroupRecords& g, std::uint64_t seq, int self,
                         const std::vector<int>& peers, const std::vector<PeerRecord>& recs,
                         std::chrono::steady_clock::time_point until, bool (*peer_failed)()) {
  for (const PeerRecord& p : recs)
    if (!p.answered) note_silent_peers();
  const std::vector<std::string>& h = world_hosts();
  const int n = static_cast<int>(h.size());
  if (self < 0 || self >= n) return "";
  const std::string& mine = h[static_cast<std::size_t>(self)];
  if (std::all_of(h.begin(), h.end(), [&](const std::string& x) { return x == mine; })) return "";
  auto host_of = [&](int r) -> const std::string& { return h[static_cast<std::size_t>(r)]; };
  // Whether each process answered (1) or not (-1): the group's peers already said; every
  // other process of another host is asked now (one query for all of them).
  std::vector<int> answered(static_cast<std::size_t>(n), 0), others;
  for (std::size_t i = 0; i < peers.size(); ++i)
    if (peers[i] >= 0 && peers[i] < n)
      answered[static_cast<std::size_t>(peers[i])] = recs[i].answered ? 1 : -1;
  for (int r = 0; r < n; ++r)
    if (r != self && answered[static_cast<std::size_t>(r)] == 0 && host_of(r) != mine)
      others.push_back(r);
  const std::vector<PeerRecord> census = flight_query(g, seq, others, until, peer_failed);
  for (std::size_t i = 0; i < others.size(); ++i)
    answered[static_cast<std::size_t>(others[i])] = census[i].answered ? 1 : -1;
  std::vector<std::string> done;
  std::ostringstream out;
  for (int r = 0; r < n; ++r) {
    const std::string& host = host_of(r);
    if (host == mine || std::find(done.begin(), done.end(), host) != done.end()) continue;
    done.push_back(host);
    std::vector<int> ranks;
    bool any = false;
    for (int q = r; q < n; ++q)
      if (host_of(q) == host) {
        ranks.push_back(q);
        any = any || answered[static_cast<std::size_t>(q)] == 1;
      }
    if (any) continue;
    note_silent_peers();
    if (out.tellp() > 0) out << "; ";
    out << host_silent(host, ranks);
  }
  return out.str();
}

std::string flight_diagnose(const GroupRecords& g, int device, const detail::CallDesc& d,
                            const CallEnd& end, bool* all_answered) {
  const std::vector<int>& members = g.members;
  std::vector<int> peers;
  for (int m : members)
    if (m != device) peers.push_back(m);
  const auto grace = std::min<Clock::duration>(end.timeout, std::chrono::milliseconds(500));
  std::vector<PeerRecord> recs =
      flight_query(g, d.seq, peers, Clock::now() + grace, end.peer_failed);
  if (all_answered != nullptr)
    *all_answered = std::all_of(recs.begin(), recs.end(), [](const PeerRecord& p) {
      return p.answered;
    });
  std::vector<detail::CallDesc> descs;
  std::vector<int> described;  // global ids of the devices in descs
  std::vector<int> missing;    // global ids
  std::vector<std::string> notes;
  descs.push_back(d);
  described.push_back(device);
  for (std::size_t i = 0; i < peers.size(); ++i) {
    const PeerRecord& p = recs[i];
    if (p.has_desc) {
      descs.push_back(p.desc);
      described.push_back(peers[i]);
      continue;
    }
    missing.push_back(peers[i]);
    std::ostringstream os;
    os << "device " << peers[i];
    if (!p.answered) {
      os << on_host(peers[i]) << " did not answer (busy outside the communicator, or gone)";
    } else if (!p.knows_group) {
      os << " has no such group; it " << p.where;
    } else {
      os << " issued " << p.issued << " call" << (p.issued == 1 ? "" : "s")
         << " on this group; it " << p.where;
    }
    notes.push_back(os.str());
  }
  // In rank order, so the message reads like the check's ("group (0,1,2,3)").
  std::vector<std::size_t> order(descs.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return std::find(members.begin(), members.end(), described[a]) <
           std::find(members.begin(), members.end(), described[b]);
  });
  std::vector<detail::CallDesc> sorted_descs;
  std::vector<int> sorted_devs;
  for (std::size_t i : order) {
    sorted_descs.push_back(descs[i]);
    sorted_devs.push_back(described[i]);
  }
  std::string disagree = detail::mismatch_message(sorted_descs, sorted_devs);
  std::ostringstream os;
  if (!disagree.empty() && missing.empty()) {
    os << disagree;
  } else {
    os << "[" << op_kind_name(static_cast<OpKind>(d.op)) << "] ";
    if (end.mpi_error.empty()) {
      os << "timed out after " << end.timeout.count() << " ms";
    } else {
      os << "failed";
    }
    os << " at call #" << d.seq << " of group " << g.label;
    if (!missing.empty()) {
      os << ": " << (missing.size() == 1 ? "device " : "devices ") << detail::join_ints(missing)
         << (end.all_arrived ? " arrived but did not complete the transfer" : " did not arrive")
         << " (";
      for (std::size_t i = 0; i < notes.size(); ++i) os << (i ? "; " : "") << notes[i];
      os << ")";
      if (!disagree.empty()) os << "; " << disagree;
    } else if (end.all_arrived || !end.checked) {
      os << ": every device arrived and agreed, but the transfer did not complete (a device "
            "left the call?)";
    }
    if (!end.mpi_error.empty()) os << "; MPI: " << end.mpi_error;
    // A device that does not answer may be busy; a host none of whose processes answers
    // is gone (killed, or cut off): say so, so the operator knows which machine to look at.
    const std::string lost =
        silent_hosts(g, d.seq, device, peers, recs, Clock::now() + grace, end.peer_failed);
    if (!lost.empty()) os << "; " << lost;
  }
  return os.str();
}

}  // namespace distjax::comm::mpi
