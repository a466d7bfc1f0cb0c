// Data-parallel training with compressed gradients, through the C ABI only.
//
// The program forks 4 ranks on this machine (loopback TCP; rank 0 hosts the rendezvous store on a
// free port). Every rank trains the same small MLP (64 -> 128 tanh -> 10) to imitate a fixed random
// "teacher" network on its own shard of synthetic data (made here from seeds, with label noise),
// sums the gradients with gw_allreduce_compressed once per layer and step, divides by the number
// of ranks and takes an SGD step. It does that once per codec, from the same initial weights,
// and rank 0 prints one line per codec: the final loss on a held-out set, its ratio to the
// uncompressed run, the bytes this rank sent per step (gw_comm_stats) and the wall time.
//
// usage: train_compressed [--ranks N] [--steps N] [--transport tcp|shm|auto] [CODEC...]
// (default codecs: none fp16 bf16 topk:0.01 randomk:0.05 sign qsgd:16 powersgd:4). PowerSGD
// views each weight matrix with its own column count and sends the biases uncompressed, as
// PyTorch's PowerSGD hook does.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gradwire/gradwire.h"

namespace {

constexpr int kIn = 64, kHidden = 128, kOut = 10;
constexpr int kBatch = 32;       // per rank and step
constexpr int kTestSize = 2048;  // held-out examples (same on every rank)

struct Mlp {
  std::vector<float> w1, b1, w2, b2;  // w1: kIn x kHidden, w2: kHidden x kOut (row-major)
};

Mlp make_mlp(uint32_t seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  Mlp m;
  m.w1.resize(kIn * kHidden);
  m.b1.assign(kHidden, 0.0f);
  m.w2.resize(kHidden * kOut);
  m.b2.assign(kOut, 0.0f);
  for (auto& x : m.w1) x = d(gen) * scale / std::sqrt(static_cast<float>(kIn));
  for (auto& x : m.w2) x = d(gen) * scale / std::sqrt(static_cast<float>(kHidden));
  for (auto& x : m.b1) x = d(gen) * 0.1f * scale;
  return m;
}

// Forward pass for one example; h gets the hidden activations.
void forward(const Mlp& m, const float* x, float* h, float* y) {
  for (int j = 0; j < kHidden; ++j) {
    float s = m.b1[j];
    for (int i = 0; i < kIn; ++i) s += x[i] * m.w1[i * kHidden + j];
    h[j] = std::tanh(s);
  }
  for (int k = 0; k < kOut; ++k) {
    float s = m.b2[k];
    for (int j = 0; j < kHidden; ++j) s += h[j] * m.w2[j * kOut + k];
    y[k] = s;
  }
}

struct Data {
  std::vector<float> x, y;
};

Data make_data(const Mlp& teacher, int n, uint32_t seed, float noise) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  Data data;
  data.x.resize(static_cast<size_t>(n) * kIn);
  data.y.resize(static_cast<size_t>(n) * kOut);
  float h[kHidden];
  for (int e = 0; e < n; ++e) {
    float* x = &data.x[static_cast<size_t>(e) * kIn];
    for (int i = 0; i < kIn; ++i) x[i] = d(gen);
    forward(teacher, x, h, &data.y[static_cast<size_t>(e) * kOut]);
    for (int k = 0; k < kOut; ++k) data.y[static_cast<size_t>(e) * kOut + k] += noise * d(gen);
  }
  return data;
}

double loss(const Mlp& m, const Data& d) {
  float h[kHidden], y[kOut];
  const int n = static_cast<int>(d.x.size() / kIn);
  double s = 0;
  for (int e = 0; e < n; ++e) {
    forward(m, &d.x[static_cast<size_t>(e) * kIn], h, y);
    for (int k = 0; k < kOut; ++k) {
      const double r = y[k] - d.y[static_cast<size_t>(e) * kOut + k];
      s += r * r;
    }
  }
  return s / n / kOut;
}

// Mean-squared-error gradient over a batch, into g (same layout as the model).
void gradient(const Mlp& m, const Data& d, int first, int count, Mlp* g) {
  g->w1.assign(m.w1.size(), 0.0f);
  g->b1.assign(m.b1.size(), 0.0f);
  g->w2.assign(m.w2.size(), 0.0f);
  g->b2.assign(m.b2.size(), 0.0f);
  const int n = static_cast<int>(d.x.size() / kIn);
  float h[kHidden], y[kOut], dy[kOut], dh[kHidden];
  const float scale = 2.0f / (static_cast<float>(count) * kOut);
  for (int b = 0; b < count; ++b) {
    const int e = (first + b) % n;
    const float* x = &d.x[static_cast<size_t>(e) * kIn];
    forward(m, x, h, y);
    for (int k = 0; k < kOut; ++k) dy[k] = (y[k] - d.y[static_cast<size_t>(e) * kOut + k]) * scale;
    for (int j = 0; j < kHidden; ++j) {
      float s = 0;
      for (int k = 0; k < kOut; ++k) {
        g->w2[j * kOut + k] += h[j] * dy[k];
        s += m.w2[j * kOut + k] * dy[k];
      }
      dh[j] = s * (1.0f - h[j] * h[j]);
      g->b1[j] += dh[j];
    }
    for (int k = 0; k < kOut; ++k) g->b2[k] += dy[k];
    for (int i = 0; i < kIn; ++i) {
      for (int j = 0; j < kHidden; ++j) g->w1[i * kHidden + j] += x[i] * dh[j];
    }
  }
}

struct Options {
  int ranks = 4;
  int steps = 1500;
  float lr = 0.05f;
  std::string transport = "tcp";
  std::vector<std::string> codecs;
};

struct Result {
  double loss = 0;
  double bytes_per_step = 0;
  double seconds = 0;
};

// One rank's training run with one codec; 0 on success.
int train(gw_comm_t comm, int rank, int world, const Options& o, const std::string& codec,
          Result* out) {
  const Mlp teacher = make_mlp(1234, 1.0f);
  const Data shard = make_data(teacher, 4096, 100 + static_cast<uint32_t>(rank), 0.1f);
  const Data test = make_data(teacher, kTestSize, 99, 0.1f);
  Mlp model = make_mlp(42, 0.5f);  // same start on every rank
  Mlp g;
  const bool psgd = codec.rfind("powersgd", 0) == 0;
  const std::string spec_w1 = psgd ? codec + ",cols=" + std::to_string(kHidden) : codec;
  const std::string spec_w2 = psgd ? codec + ",cols=" + std::to_string(kOut) : codec;
  const std::string spec_b = psgd ? "none" : codec;
  gw_comm_reset_stats(comm);
  const auto t0 = std::chrono::steady_clock::now();
  for (int step = 0; step < o.steps; ++step) {
    gradient(model, shard, step * kBatch, kBatch, &g);
    struct Part {
      std::vector<float>* grad;
      std::vector<float>* param;
      const std::string* spec;
      std::string key;
    } parts[] = {{&g.w1, &model.w1, &spec_w1, codec + "/w1"},
                 {&g.b1, &model.b1, &spec_b, codec + "/b1"},
                 {&g.w2, &model.w2, &spec_w2, codec + "/w2"},
                 {&g.b2, &model.b2, &spec_b, codec + "/b2"}};
    for (auto& p : parts) {
      gw_status_t s = gw_allreduce_compressed(comm, p.grad->data(), p.grad->size(), GW_FLOAT32,
                                              p.spec->c_str(), p.key.c_str());
      if (s != GW_OK) {
        std::fprintf(stderr, "rank %d: %s step %d: %s (%s)\n", rank, codec.c_str(), step,
                     gw_status_string(s), gw_last_error());
        return 1;
      }
      const float f = o.lr / static_cast<float>(world);
      for (size_t i = 0; i < p.param->size(); ++i) (*p.param)[i] -= f * (*p.grad)[i];
    }
  }
  out->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  gw_comm_stats_t st{};
  gw_comm_stats(comm, &st);
  out->bytes_per_step = static_cast<double>(st.bytes_sent) / o.steps;
  out->loss = loss(model, test);
  return 0;
}

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

int run_rank(int rank, const Options& o, const std::string& store) {
  gw_config_t cfg = GW_CONFIG_INIT;
  cfg.rank = rank;
  cfg.world_size = o.ranks;
  cfg.store_addr = store.c_str();
  cfg.transport = o.transport.c_str();
  cfg.timeout_ms = 60000;
  gw_comm_t comm = nullptr;
  if (gw_comm_init(&comm, &cfg) != GW_OK) {
    std::fprintf(stderr, "rank %d: gw_comm_init: %s\n", rank, gw_last_error());
    return 1;
  }
  double base = 0;
  int rc = 0;
  if (rank == 0) {
    std::printf("%-16s %12s %10s %16s %10s\n", "codec", "final_loss", "vs_none", "bytes_sent/step",
                "wall_s");
  }
  for (const auto& codec : o.codecs) {
    Result r;
    if (train(comm, rank, o.ranks, o, codec, &r) != 0) {
      rc = 1;
      break;
    }
    if (codec == "none") base = r.loss;
    if (rank == 0) {
      std::printf("%-16s %12.6f %10s %16.0f %10.2f\n", codec.c_str(), r.loss,
                  base > 0 ? std::to_string(r.loss / base).substr(0, 6).c_str() : "-",
                  r.bytes_per_step, r.seconds);
      std::fflush(stdout);
    }
  }
  gw_comm_release_compression(comm);
  gw_comm_destroy(comm);
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--ranks" || a == "--steps" || a == "--transport" || a == "--lr") && i + 1 < argc) {
      const std::string v = argv[++i];
      if (a == "--ranks") o.ranks = std::atoi(v.c_str());
      if (a == "--steps") o.steps = std::atoi(v.c_str());
      if (a == "--lr") o.lr = std::strtof(v.c_str(), nullptr);
      if (a == "--transport") o.transport = v;
    } else if (a == "-h" || a == "--help") {
      std::printf(
          "usage: %s [--ranks N] [--steps N] [--lr X] [--transport tcp|shm|auto] "
          "[CODEC...]\n",
          argv[0]);
      return 0;
    } else {
      o.codecs.push_back(a);
    }
  }
  if (o.ranks < 1 || o.ranks > 64 || o.steps < 1) {
    std::fprintf(stderr, "--ranks must be 1..64 and --steps >= 1\n");
    return 2;
  }
  if (o.codecs.empty()) {
    o.codecs = {"none",         "fp16", "bf16",    "topk:0.01",
                "randomk:0.05", "sign", "qsgd:16", "powersgd:4"};
  } else if (o.codecs.front() != "none") {
    o.codecs.insert(o.codecs.begin(), "none");  // the baseline of the ratio column
  }
  const int port = free_port();
  if (port < 0) {
    std::perror("free port");
    return 2;
  }
  const std::string store = "127.0.0.1:" + std::to_string(port);
  std::fflush(stdout);
  std::vector<pid_t> pids;
  for (int r = 0; r < o.ranks; ++r) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      for (pid_t p : pids) kill(p, SIGKILL);
      for (pid_t p : pids) waitpid(p, nullptr, 0);
      return 2;
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      _exit(run_rank(r, o, store));
    }
    pids.push_back(pid);
  }
  // Any rank failing ends the run: the others are killed rather than left waiting on it.
  int rc = 0;
  size_t left = pids.size();
  while (left > 0) {
    int status = 0;
    const pid_t p = waitpid(-1, &status, 0);
    if (p < 0) break;
    --left;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      if (rc == 0) std::fprintf(stderr, "a rank failed (pid %d); stopping the others\n", p);
      rc = 1;
      for (pid_t q : pids) kill(q, SIGKILL);
    }
  }
  return rc;
}
