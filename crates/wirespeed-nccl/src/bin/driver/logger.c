/* The driver's stand-in for NCCL's logger: a real C variadic function (Rust cannot define one on
 * stable), so the plugin's calls go through exactly the calling convention NCCL's ncclDebugLog
 * receives. It formats the line and hands it to the driver (driver_log_line in main.rs). */
#include <stdarg.h>
#include <stdio.h>

void driver_log_line(int level, unsigned long flags, const char* msg);

void driver_log(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  char buf[4096];
  va_list ap;
  (void)file;
  (void)line;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  driver_log_line(level, flags, buf);
}
