# NSTF — the two commands of the README, and a few more.
#   make run    build if needed, fetch the default model if missing, generate text
#   make test   build and run every test
#   make fuzz   build the libFuzzer targets (clang) and run each FUZZ_SECONDS
BUILD      ?= build
JOBS       ?= $(shell nproc 2>/dev/null || echo 2)
MODEL      ?= models/SmolLM2-135M-Instruct.Q4_1.gguf
PROMPT     ?= What are three good reasons to learn the C programming language?
N_PREDICT  ?= 128
CMAKE_ARGS ?=
FUZZ_SECONDS ?= 60

.PHONY: all build run test model deps deps-amd amd cuda clean test-asan test-gpu fuzz fuzz-ci

all: build

# A fresh machine gets its build dependencies on the first configure.
$(BUILD)/CMakeCache.txt:
	sh scripts/install_deps.sh
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

$(MODEL):
	sh scripts/fetch_model.sh $(MODEL)

model: $(MODEL)

run: build $(MODEL)
	./$(BUILD)/nstf run -m $(MODEL) --chat -p "$(PROMPT)" -n $(N_PREDICT)

test: build $(MODEL)
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# AddressSanitizer + UndefinedBehaviorSanitizer build of the whole CPU suite
# (-O2 -g: the sanitizers see the code that ships, and the end-to-end test
# stays fast enough for CI).
test-asan:
	$(MAKE) test BUILD=build-asan CMAKE_ARGS="-DCMAKE_BUILD_TYPE=RelWithDebInfo -DNSTF_SANITIZE=address,undefined"

# CUDA build of everything (nvcc; sm_90a + sm_80 unless GPU_TARGETS says
# otherwise). CI runs it without a GPU, so a kernel that stops compiling fails.
# Without LAPACKE (the SVD of nstf lowrank, a CPU job): the GPU machines
# need no liblapacke to run its binaries; CMAKE_ARGS=-DNSTF_LAPACKE=AUTO
# brings it back.
cuda:
	cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DNSTF_CUDA=ON -DNSTF_LAPACKE=OFF $(CMAKE_ARGS)
	cmake --build build-cuda -j $(JOBS)

# The GPU tests, on a machine with an NVIDIA GPU.
test-gpu: cuda
	./build-cuda/tests/test_backend_ops_gpu
	./build-cuda/tests/test_ops_gpu
	./build-cuda/tests/test_gemm_gpu
	./build-cuda/tests/test_attention_gpu
	./build-cuda/tests/test_paged_attn_gpu
	./build-cuda/tests/test_conv_gpu
	./build-cuda/tests/test_levels_gpu
	./build-cuda/tests/test_determinism_gpu
	./build-cuda/tests/test_e2e_gpu
	./build-cuda/tests/test_train_gpu
	./build-cuda/tests/test_lowrank_gpu

# libFuzzer targets (fuzz/Makefile, clang + ASan/UBSan, apart from the gcc
# build): each runs FUZZ_SECONDS; a crash fails and lands in fuzz/findings/.
fuzz:
	$(MAKE) -C fuzz run FUZZ_SECONDS=$(FUZZ_SECONDS)

fuzz-ci:
	$(MAKE) -C fuzz run FUZZ_SECONDS=30

# System packages the build needs (Debian). CI calls this; a developer may too.
deps:
	sh scripts/install_deps.sh

# The AMD toolchains (Debian's hipcc and clang-19) on top of `deps`.
deps-amd: deps
	sh scripts/install_deps.sh amd

# Every GPU kernel built for gfx90a (hipcc: code objects), gfx942 and gfx1100
# (clang-19: device assembly), and sm_90a (nvcc, when present), then the
# machine-code gates of docs/amd_gates.tsv checked by `nstf isa` (matrix
# instructions, no scratch, occupancy floors). Any failure fails. The full
# report is left in $(AMD_OUT)/isa.md.
AMD_OUT ?= build-amd
amd: deps-amd build
	sh scripts/build_hip.sh $(AMD_OUT)
	sh scripts/build_cuda_isa.sh $(AMD_OUT)
	./$(BUILD)/nstf isa --dir $(AMD_OUT) > $(AMD_OUT)/isa.md
	./$(BUILD)/nstf isa --dir $(AMD_OUT) --check docs/amd_gates.tsv

clean:
	rm -rf $(BUILD) build-asan build-cuda build-fuzz build-amd
