#pragma once
// Errors a kernel finds in its inputs where the host cannot look without a synchronisation (a NaN router logit):
// the kernel stores a code, and a detail such as the row, into one record of host-mapped pinned memory; the host
// reads it after its next synchronisation with check_device_errors(), which throws the registered message. The
// engine checks after every step that samples (that step has synchronised already); code that runs ops directly
// checks after its own sync. Stores are plain (no system-scope atomics, which PCIe hosts may lack): when several
// threads report at once, one of their details survives.
#include <cstdint>
#include <string>

namespace kbn {

struct DeviceErrorRecord {
  int32_t code;    // 0: nothing recorded
  int32_t unused;
  int64_t detail;  // what the message's "{detail}" stands for (e.g. a token index)
};

// The process's record: portable, mapped pinned memory whose address every device can write (unified addressing).
// Allocated on first use; nullptr in a build without CUDA.
DeviceErrorRecord* device_error_record();

// A stable nonzero code for `message` (registered once; "{detail}" in it is replaced by the recorded detail).
int32_t device_error_code(const std::string& message);

// Throws kbn::Error with the recorded message, after clearing the record, when a kernel recorded one. Call it after
// a synchronisation with the devices that may have written it. Costs a host memory read; does nothing before any
// kernel path has asked for the record (CPU runs).
void check_device_errors();

}  // namespace kbn
