// Bare SentencePiece encoding in C++: the same library zt-prep's plugin links (libsentencepiece),
// called directly on N threads over the texts written by prep_python.py --dump-texts. This is the
// floor for zt-prep: tokenizing the same text with nothing else around it.
//
// usage: spm_bare TOKENIZER.model TEXTS.bin THREADS      (prints texts, ids and seconds)
#include <sentencepiece_processor.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

int main(int argc, char **argv)
{
    if (argc != 4) {
        std::fprintf(stderr, "usage: spm_bare TOKENIZER.model TEXTS.bin THREADS\n");
        return 2;
    }
    sentencepiece::SentencePieceProcessor sp;
    const auto status = sp.Load(argv[1]);
    if (!status.ok()) {
        std::fprintf(stderr, "spm_bare: %s\n", status.ToString().c_str());
        return 1;
    }
    std::ifstream in(argv[2], std::ios::binary);
    const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::string_view> texts;
    for (size_t pos = 0; pos + 4 <= data.size();) {
        uint32_t n;
        std::memcpy(&n, data.data() + pos, 4);
        texts.emplace_back(data.data() + pos + 4, n);
        pos += 4 + n;
    }
    const int n_threads = std::atoi(argv[3]);
    std::atomic<size_t> next{0};
    std::atomic<uint64_t> total_ids{0};
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> workers;
    for (int t = 0; t < n_threads; t++)
        workers.emplace_back([&] {
            std::vector<int> ids;
            uint64_t count = 0;
            for (size_t begin; (begin = next.fetch_add(256)) < texts.size();)
                for (size_t i = begin; i < begin + 256 && i < texts.size(); i++) {
                    sp.Encode(texts[i], &ids);
                    count += ids.size();
                }
            total_ids += count;
        });
    for (auto &w : workers) w.join();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%zu %llu %.3f\n", texts.size(), static_cast<unsigned long long>(total_ids.load()), seconds);
    return 0;
}
