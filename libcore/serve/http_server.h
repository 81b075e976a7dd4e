// HttpServer: coli-serve's HTTP/1.1 side (Boost.Beast): the
// OpenAI-compatible endpoints over one EngineGenerator.
//
//   GET  /health                 {"status": "ok"}
//   GET  /v1/models              the one model
//   POST /v1/chat/completions    messages -> reply (stream: server-sent events)
//   POST /v1/completions         prompt -> continuation (stream likewise)
//   POST /tokenize, /detokenize  llama-server's shapes
//   GET  /metrics                Prometheus text
//
// Errors are OpenAI's {"error": {...}} bodies with their status (400 bad
// field, 401 no or wrong API key, 404 unknown path or model, 413 body over
// max_body, 503 queue full); a malformed request never ends the server.
//
// Threads: run() accepts on the calling thread and serves each connection
// on a thread of its own (keep-alive), at most max_connections at once;
// up to the generator's parallel() generations run at once (its slots,
// decoded together); a further request waits while fewer than `queue`
// wait, else 503. A streaming client that goes away
// cancels its generation at the next token. stop() (any thread) ends run()
// once the connections in flight have finished their current response
// (idle keep-alive connections are woken and closed at once).
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <chrono>
#include <map>
#include <mutex>
#include <string>

#include "serve/engine_generator.h"
#include "serve/openai_api.h"

namespace coli::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: a free port (port() says which)
  std::string api_key;  // empty: no key asked for
  std::size_t max_body = 4u << 20;
  int queue = 16;             // requests that may wait for a slot
  int max_connections = 1024;  // more are closed at once, the others served
  // A connection that has sent no request for this long is closed (a
  // client holding connections open cannot use up max_connections).
  int idle_timeout_s = 30;
  // A stream chunk that cannot go out for this long (a client that stopped
  // reading its stream) ends the stream: the generation is cancelled and
  // the slot freed.
  int write_timeout_s = 30;
  ApiLimits limits;
};

// Counters for /metrics (since the server started).
struct ServerCounters {
  std::atomic<uint64_t> requests{0}, errors{0}, prompt_tokens{0}, prompt_computed{0}, generated_tokens{0}, cancelled{0};
  std::atomic<double> prompt_ms{0}, predicted_ms{0};
  std::atomic<int> waiting{0}, active{0}, connections{0};
};

class HttpServer {
 public:
  // Binds host:port (coli::Error naming them when it cannot). extra_metrics
  // appends lines to /metrics (the tool's tier counters), called under the slot.
  HttpServer(const ServerOptions& opt, EngineGenerator& gen, std::function<std::string()> extra_metrics = {});
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }
  void run();
  void stop();
  const ServerCounters& counters() const { return counters_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  ServerOptions opt_;
  EngineGenerator& gen_;
  std::function<std::string()> extra_metrics_;
  int port_ = 0;
  ServerCounters counters_;
  std::atomic<bool> stopping_{false};
  // The generator's slots as permits: a request holds one from before its
  // generation until its response is out.
  std::mutex permits_mu_;
  std::condition_variable permits_cv_;
  int permits_ = 0;
  std::mutex conn_mu_;
  std::condition_variable conn_cv_;     // connections reaching 0
  // The connections' sockets and since when each has waited for a request
  // (time_point::max(): answering one); stop() and the idle reaper shut
  // their reading side.
  std::map<int, std::chrono::steady_clock::time_point> open_fds_;
  void reap_idle();  // run()'s helper thread: closes connections idle past idle_timeout_s
  void serve_connection(void* socket);  // takes ownership of a tcp::socket*
};

}  // namespace coli::serve
