// Fuzz target: --schedule-file (05_pipeline/schedule.c). The first byte picks
// the number of pipeline ranks (1 to 8), the rest is the file. Any bytes
// must give either lists that the validator then accepts or refuses, or a
// message naming the line, never a crash, a hang or a huge allocation.
#include "fuzz.h"
#include "schedule.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    int pp = 1 + data[0] % 8;
    const char* path = fuzz_write(data + 1, size - 1);
    Schedule s;
    char msg[1024];
    if (schedule_read(&s, path, pp, msg, sizeof(msg)) != NULL) return 0;
    ScheduleSim sim;
    schedule_validate(&s, &sim, msg, sizeof(msg));
    schedule_free(&s);
    return 0;
}
