/* A stand-in for NVIDIA's libnvidia-ml.so.1: the entry points Telltale's NVML meter calls,
 * answering with known counters, so the real nvidia-ml-py binding is exercised without a GPU.
 *
 * Two devices. Device 0's total-energy counter starts at 5 000 000 mJ and grows by
 * 1 000 000 mJ (1 kJ) at each read; device 1 has no energy counter (NOT_SUPPORTED, as an
 * old board) and draws 150 W. Device 0 draws 250 W. Utilisation 75 % / 25 %; memory in use
 * 10 GiB / 5 GiB. Built by tests/servers/nvml.py with the system C compiler.
 */
#include <stdio.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef long nvmlDevice_t; /* a handle: 1 + the index */

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3

static int initialised = 0;
static unsigned long long energy_mj[2] = {5000000ULL, 0ULL};

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; initialised = 1; return NVML_SUCCESS; }
nvmlReturn_t nvmlInit_v2(void) { initialised = 1; return NVML_SUCCESS; }
nvmlReturn_t nvmlShutdown(void) { initialised = 0; return NVML_SUCCESS; }

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    *count = 2;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (index > 1) return NVML_ERROR_INVALID_ARGUMENT;
    *device = (nvmlDevice_t)index + 1;
    return NVML_SUCCESS;
}

static int index_of(nvmlDevice_t device) {
    return (device == 1 || device == 2) ? (int)device - 1 : -1;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    int i = index_of(device);
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (i < 0 || length < 1) return NVML_ERROR_INVALID_ARGUMENT;
    snprintf(name, length, "Stand-in GPU %d", i);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *mj) {
    int i = index_of(device);
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (i < 0) return NVML_ERROR_INVALID_ARGUMENT;
    if (i == 1) return NVML_ERROR_NOT_SUPPORTED;
    *mj = energy_mj[i];
    energy_mj[i] += 1000000ULL;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *mw) {
    int i = index_of(device);
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (i < 0) return NVML_ERROR_INVALID_ARGUMENT;
    *mw = i == 0 ? 250000u : 150000u;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *util) {
    int i = index_of(device);
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (i < 0) return NVML_ERROR_INVALID_ARGUMENT;
    util->gpu = i == 0 ? 75u : 25u;
    util->memory = 10u;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    int i = index_of(device);
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (i < 0) return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = 80ULL << 30;
    memory->used = i == 0 ? 10ULL << 30 : 5ULL << 30;
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}
