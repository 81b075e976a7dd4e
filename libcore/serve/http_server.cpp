#include "serve/http_server.h"

#include <poll.h>
#include <sys/socket.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <ctime>
#include <random>
#include <sstream>
#include <thread>

namespace coli::serve {

namespace net = boost::asio;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;
using nlohmann::json;

struct HttpServer::Impl {
  net::io_context ioc;
  tcp::acceptor acceptor{ioc};
};

namespace {

using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;

int64_t now_s() { return static_cast<int64_t>(std::time(nullptr)); }

std::string new_id(const char* prefix) {
  static std::atomic<uint64_t> n{0};
  static const uint64_t salt = std::random_device{}();
  std::ostringstream s;
  s << prefix << std::hex << salt << '-' << n.fetch_add(1);
  return s.str();
}

Response reply(const Request& req, http::status st, const std::string& body, const char* type = "application/json") {
  Response res{st, req.version()};
  res.set(http::field::server, "coli-serve");
  res.set(http::field::content_type, type);
  res.keep_alive(req.keep_alive());
  res.body() = body;
  res.prepare_payload();
  return res;
}

Response error_reply(const Request& req, const ApiError& e) { return reply(req, static_cast<http::status>(e.status()), error_body(e)); }

}  // namespace

HttpServer::HttpServer(const ServerOptions& opt, EngineGenerator& gen, std::function<std::string()> extra_metrics)
    : impl_(std::make_unique<Impl>()), opt_(opt), gen_(gen), extra_metrics_(std::move(extra_metrics)), permits_(gen.parallel()) {
  boost::system::error_code ec;
  const auto addr = net::ip::make_address(opt_.host, ec);
  if (ec) throw Error("coli-serve: --host " + opt_.host + ": not an IP address (" + ec.message() + ")");
  if (opt_.port < 0 || opt_.port > 65535) throw Error("coli-serve: --port " + std::to_string(opt_.port) + ": not a port");
  const tcp::endpoint ep(addr, static_cast<unsigned short>(opt_.port));
  auto& a = impl_->acceptor;
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(net::socket_base::max_listen_connections, ec);
  if (ec) throw Error("coli-serve: cannot listen on " + opt_.host + ":" + std::to_string(opt_.port) + ": " + ec.message());
  port_ = a.local_endpoint().port();
}

HttpServer::~HttpServer() {
  stop();
  std::unique_lock<std::mutex> lock(conn_mu_);
  conn_cv_.wait(lock, [&] { return counters_.connections.load() == 0; });
}

void HttpServer::stop() {
  if (stopping_.exchange(true)) return;
  {  // a connection waiting for its next request reads end-of-file; one answering finishes
    std::lock_guard<std::mutex> lock(conn_mu_);
    for (const auto& [fd, since] : open_fds_) ::shutdown(fd, SHUT_RD);
  }
  conn_cv_.notify_all();  // the reaper
  // Wake the accept with a connection of our own (closing an acceptor another
  // thread is blocked in is not safe in asio).
  try {
    net::io_context ioc;
    tcp::socket s(ioc);
    boost::system::error_code ec;
    s.connect(tcp::endpoint(net::ip::make_address(opt_.host == "0.0.0.0" ? "127.0.0.1" : opt_.host == "::" ? "::1" : opt_.host), port_), ec);
  } catch (...) {
  }
}

void HttpServer::reap_idle() {
  using clock = std::chrono::steady_clock;
  std::unique_lock<std::mutex> lock(conn_mu_);
  while (!stopping_) {
    conn_cv_.wait_for(lock, std::chrono::milliseconds(250));
    const auto limit = clock::now() - std::chrono::seconds(opt_.idle_timeout_s);
    for (auto& [fd, since] : open_fds_)
      if (since < limit) ::shutdown(fd, SHUT_RD), since = clock::time_point::max();
  }
}

void HttpServer::run() {
  std::thread reaper([this] { reap_idle(); });
  while (!stopping_) {
    auto sock = std::make_unique<tcp::socket>(impl_->ioc);
    boost::system::error_code ec;
    impl_->acceptor.accept(*sock, ec);
    if (stopping_) break;
    if (ec) continue;
    if (counters_.connections.load() >= opt_.max_connections) {
      sock->close(ec);  // over the limit: refused at once, the others keep being served
      continue;
    }
    ++counters_.connections;
    std::thread([this, s = sock.release()] {
      serve_connection(s);
      std::lock_guard<std::mutex> lock(conn_mu_);
      --counters_.connections;
      conn_cv_.notify_all();
    }).detach();
  }
  boost::system::error_code ec;
  impl_->acceptor.close(ec);
  conn_cv_.notify_all();
  reaper.join();
  std::unique_lock<std::mutex> lock(conn_mu_);
  conn_cv_.wait(lock, [&] { return counters_.connections.load() == 0; });
}

void HttpServer::serve_connection(void* raw) {
  std::unique_ptr<tcp::socket> sock(static_cast<tcp::socket*>(raw));
  const int fd = sock->native_handle();
  auto waiting = [&](bool w) {
    std::lock_guard<std::mutex> lock(conn_mu_);
    open_fds_[fd] = w ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point::max();
    if (stopping_) ::shutdown(fd, SHUT_RD);
  };
  waiting(true);
  struct Unlist {
    HttpServer* s;
    int fd;
    ~Unlist() {
      std::lock_guard<std::mutex> lock(s->conn_mu_);
      s->open_fds_.erase(fd);
    }
  } unlist{this, fd};
  boost::beast::flat_buffer buf;
  boost::system::error_code ec;
  while (!stopping_) {
    http::request_parser<http::string_body> parser;
    parser.body_limit(opt_.max_body);
    waiting(true);
    http::read(*sock, buf, parser, ec);
    waiting(false);
    if (ec == http::error::body_limit) {
      Request req;
      req.version(11);
      const ApiError e(413, "invalid_request_error", "the request body exceeds " + std::to_string(opt_.max_body) + " bytes (--max-body)");
      Response res = error_reply(req, e);
      res.keep_alive(false);
      http::write(*sock, res, ec);
      // A client still sending its body would get a reset instead of the
      // 413 if the socket closed now: stop sending, read what it sends
      // (at most 64 MiB, 5 s), then close.
      sock->shutdown(tcp::socket::shutdown_send, ec);
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      char sink[65536];
      for (std::size_t drained = 0; drained < (64u << 20) && std::chrono::steady_clock::now() < until;) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 200) < 0) break;
        if (!(p.revents & (POLLIN | POLLHUP | POLLERR))) continue;
        const ssize_t n = ::recv(fd, sink, sizeof sink, 0);
        if (n <= 0) break;
        drained += static_cast<std::size_t>(n);
      }
      break;
    }
    if (ec) break;  // closed, or not HTTP
    const Request req = parser.release();
    ++counters_.requests;
    bool streamed = false;
    Response res;
    try {
      const std::string target(req.target());
      const std::string path = target.substr(0, target.find('?'));
      const bool get = req.method() == http::verb::get, post = req.method() == http::verb::post;
      if (!opt_.api_key.empty() && path != "/health") {
        const auto auth = req[http::field::authorization];
        if (std::string(auth) != "Bearer " + opt_.api_key)
          throw ApiError(401, "authentication_error", "missing or wrong API key (Authorization: Bearer KEY)");
      }
      if (get && path == "/health") {
        res = reply(req, http::status::ok, R"({"status":"ok"})");
      } else if (get && path == "/v1/models") {
        res = reply(req, http::status::ok, models_list(opt_.limits.model_name, now_s()).dump());
      } else if (get && path == "/metrics") {
        std::ostringstream m;
        const ServerCounters& c = counters_;
        m << "# TYPE coli_requests_total counter\ncoli_requests_total " << c.requests << "\n";
        m << "# TYPE coli_request_errors_total counter\ncoli_request_errors_total " << c.errors << "\n";
        m << "# TYPE coli_prompt_tokens_total counter\ncoli_prompt_tokens_total " << c.prompt_tokens << "\n";
        m << "# TYPE coli_prompt_tokens_computed_total counter\ncoli_prompt_tokens_computed_total " << c.prompt_computed << "\n";
        m << "# TYPE coli_generated_tokens_total counter\ncoli_generated_tokens_total " << c.generated_tokens << "\n";
        m << "# TYPE coli_cancelled_total counter\ncoli_cancelled_total " << c.cancelled << "\n";
        m << "# TYPE coli_prompt_tokens_per_second gauge\ncoli_prompt_tokens_per_second "
          << (c.prompt_ms > 0 ? c.prompt_computed * 1000.0 / c.prompt_ms : 0.0) << "\n";
        m << "# TYPE coli_generated_tokens_per_second gauge\ncoli_generated_tokens_per_second "
          << (c.predicted_ms > 0 ? c.generated_tokens * 1000.0 / c.predicted_ms : 0.0) << "\n";
        m << "# TYPE coli_queue_depth gauge\ncoli_queue_depth " << c.waiting << "\n";
        m << "# TYPE coli_requests_processing gauge\ncoli_requests_processing " << c.active << "\n";
        const long long steps = gen_.decode_steps();
        m << "# TYPE coli_slots gauge\ncoli_slots " << gen_.parallel() << "\n";
        m << "# TYPE coli_decode_steps_total counter\ncoli_decode_steps_total " << steps << "\n";
        m << "# TYPE coli_decode_rows_per_step gauge\ncoli_decode_rows_per_step " << (steps ? double(gen_.decode_rows()) / double(steps) : 0.0) << "\n";
        const EngineGenerator::PhaseSeconds ph = gen_.phase_seconds();
        m << "# TYPE coli_scheduler_seconds_total counter\n";
        for (const auto& [name, v] : {std::pair<const char*, double>{"prompt", ph.prompt}, {"decode_forward", ph.decode_forward},
                                      {"decode_sample", ph.decode_sample}, {"admit", ph.admit}})
          m << "coli_scheduler_seconds_total{phase=\"" << name << "\"} " << v << "\n";
        if (extra_metrics_) gen_.with_engine([&] { m << extra_metrics_(); });
        res = reply(req, http::status::ok, m.str(), "text/plain; version=0.0.4");
      } else if (post && path == "/tokenize") {
        const std::vector<int> ids = gen_.tokenizer().encode(parse_tokenize_request(req.body()));
        res = reply(req, http::status::ok, json{{"tokens", ids}}.dump());
      } else if (post && path == "/detokenize") {
        const std::string text = gen_.tokenizer().decode(parse_detokenize_request(req.body(), gen_.tokenizer().vocab_size()));
        res = reply(req, http::status::ok, json{{"content", text}}.dump(-1, ' ', false, json::error_handler_t::replace));
      } else if (post && (path == "/v1/chat/completions" || path == "/v1/completions")) {
        const bool chat = path == "/v1/chat/completions";
        const GenerationRequest r = chat ? parse_chat_request(req.body(), opt_.limits) : parse_completion_request(req.body(), opt_.limits);
        const std::vector<int> prompt = gen_.prompt_ids(r);  // a prompt too long for the context: 400 before waiting
        if (counters_.waiting.fetch_add(1) >= opt_.queue) {
          --counters_.waiting;
          throw ApiError(503, "server_error", "the server is busy: " + std::to_string(opt_.queue) + " requests are waiting (--queue)");
        }
        {
          std::unique_lock<std::mutex> lock(permits_mu_);
          permits_cv_.wait(lock, [&] { return permits_ > 0; });
          --permits_;
        }
        struct Permit {
          HttpServer& s;
          ~Permit() {
            {
              std::lock_guard<std::mutex> lock(s.permits_mu_);
              ++s.permits_;
            }
            s.permits_cv_.notify_one();
          }
        } permit{*this};
        --counters_.waiting;
        ++counters_.active;
        const std::string id = new_id(chat ? "chatcmpl-" : "cmpl-");
        const int64_t created = now_s();
        const std::string& model = opt_.limits.model_name;
        GenerationResult g;
        GenerationRequest run = r;
        if (!run.seeded) run.sampling.seed = std::random_device{}();
        try {
          if (r.stream) {
            http::response<http::empty_body> head{http::status::ok, req.version()};
            head.set(http::field::server, "coli-serve");
            head.set(http::field::content_type, "text/event-stream");
            head.set(http::field::cache_control, "no-cache");
            head.keep_alive(req.keep_alive());
            head.chunked(true);
            http::response_serializer<http::empty_body> sr{head};
            http::write_header(*sock, sr, ec);
            streamed = true;
            bool first = true, alive = !ec;
            auto send = [&](const std::string& data) {
              if (!alive) return false;
              // A client that stopped reading: its socket stays full; after
              // write_timeout_s it counts as gone (asio's blocking write would wait forever).
              pollfd p{fd, POLLOUT, 0};
              if (::poll(&p, 1, opt_.write_timeout_s * 1000) != 1 || !(p.revents & POLLOUT)) return alive = false;
              net::write(*sock, http::make_chunk(net::buffer(data)), ec);
              alive = !ec;
              return alive;
            };
            g = gen_.run(run, prompt, [&](const std::string& piece) {
              const bool ok = send(sse(chat ? chat_chunk(id, created, model, piece, first, "", nullptr) : completion_chunk(id, created, model, piece, "", nullptr)));
              first = false;
              return ok;
            });
            if (!g.cancelled) {
              if (chat && first) send(sse(chat_chunk(id, created, model, "", true, "", nullptr)));  // the role, even for an empty reply
              send(sse(chat ? chat_chunk(id, created, model, "", false, g.finish_reason, &g.usage)
                            : completion_chunk(id, created, model, "", g.finish_reason, &g.usage)));
              if (r.include_usage) send(sse(usage_chunk(id, created, model, chat, g.usage)));
              send(sse_done());
              if (alive) net::write(*sock, http::make_chunk_last(), ec);
            }
          } else {
            std::string text;
            g = gen_.run(run, prompt, [&](const std::string& piece) {
              text += piece;
              return true;
            });
            res = reply(req, http::status::ok,
                        (chat ? chat_response(id, created, model, text, g.finish_reason, g.usage)
                              : completion_response(id, created, model, text, g.finish_reason, g.usage))
                            .dump(-1, ' ', false, json::error_handler_t::replace));
          }
        } catch (...) {
          --counters_.active;
          throw;
        }
        --counters_.active;
        counters_.prompt_tokens += g.usage.prompt_tokens, counters_.generated_tokens += g.usage.completion_tokens;
        counters_.prompt_computed += g.usage.prompt_fed >= 0 ? g.usage.prompt_fed : g.usage.prompt_tokens;
        counters_.prompt_ms.fetch_add(g.usage.prompt_ms), counters_.predicted_ms.fetch_add(g.usage.predicted_ms);
        if (g.cancelled) ++counters_.cancelled;
        if (streamed && (g.cancelled || ec)) break;  // the client is gone
      } else {
        throw ApiError(404, "invalid_request_error", "no endpoint " + std::string(req.method_string()) + " " + path);
      }
    } catch (const ApiError& e) {
      ++counters_.errors;
      if (streamed) break;  // mid-stream: nothing else can be said
      res = error_reply(req, e);
    } catch (const std::exception& e) {
      ++counters_.errors;
      if (streamed) break;
      res = error_reply(req, ApiError(500, "server_error", e.what()));
    }
    if (streamed) {
      if (!req.keep_alive()) break;
      continue;
    }
    http::write(*sock, res, ec);
    if (ec || !res.keep_alive()) break;
  }
  sock->shutdown(tcp::socket::shutdown_both, ec);
}

}  // namespace coli::serve
