/* A hiredis program against conveyor-kv: plain commands, binary-safe
 * arguments, pipelining (redisAppendCommand), errors as REDIS_REPLY_ERROR.
 * Usage: kv_hiredis_client PORT. Prints "hiredis: ok" and exits 0 on success. */
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;
#define CHECK(cond, ...)                         \
  do {                                           \
    if (!(cond)) {                               \
      fprintf(stderr, "hiredis: FAILED: " __VA_ARGS__); \
      fprintf(stderr, " (line %d)\n", __LINE__); \
      ++failures;                                \
    }                                            \
  } while (0)

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  struct timeval tv = {10, 0};
  redisContext* c = redisConnectWithTimeout("127.0.0.1", atoi(argv[1]), tv);
  if (c == NULL || c->err) {
    fprintf(stderr, "hiredis: cannot connect: %s\n", c ? c->errstr : "?");
    return 1;
  }
  redisSetTimeout(c, tv);
  redisReply* r = redisCommand(c, "PING");
  CHECK(r && r->type == REDIS_REPLY_STATUS && strcmp(r->str, "PONG") == 0, "PING");
  freeReplyObject(r);
  const char bin[] = "a\0b\r\nc";
  r = redisCommand(c, "SET %b %b", "bin", (size_t)3, bin, sizeof bin);
  CHECK(r && r->type == REDIS_REPLY_STATUS && strcmp(r->str, "OK") == 0, "SET binary");
  freeReplyObject(r);
  r = redisCommand(c, "GET bin");
  CHECK(r && r->type == REDIS_REPLY_STRING && r->len == sizeof bin && memcmp(r->str, bin, sizeof bin) == 0,
        "GET binary");
  freeReplyObject(r);
  r = redisCommand(c, "GET missing");
  CHECK(r && r->type == REDIS_REPLY_NIL, "GET missing is nil");
  freeReplyObject(r);
  r = redisCommand(c, "INCRBY n %d", 5);
  CHECK(r && r->type == REDIS_REPLY_INTEGER && r->integer == 5, "INCRBY");
  freeReplyObject(r);
  r = redisCommand(c, "NOSUCHCOMMAND x");
  CHECK(r && r->type == REDIS_REPLY_ERROR && strncmp(r->str, "ERR unknown command", 19) == 0, "unknown command");
  freeReplyObject(r);
  /* Pipelining: 1000 SETs and GETs sent before any reply is read. */
  for (int i = 0; i < 1000; ++i) {
    redisAppendCommand(c, "SET key:%d %d", i, i);
    redisAppendCommand(c, "GET key:%d", i);
  }
  for (int i = 0; i < 1000; ++i) {
    void* v;
    CHECK(redisGetReply(c, &v) == REDIS_OK, "pipelined SET reply");
    r = v;
    CHECK(r && r->type == REDIS_REPLY_STATUS, "pipelined SET");
    freeReplyObject(r);
    CHECK(redisGetReply(c, &v) == REDIS_OK, "pipelined GET reply");
    r = v;
    char want[16];
    snprintf(want, sizeof want, "%d", i);
    CHECK(r && r->type == REDIS_REPLY_STRING && strcmp(r->str, want) == 0, "pipelined GET %d", i);
    freeReplyObject(r);
    if (failures) break;
  }
  r = redisCommand(c, "MGET key:1 nope key:2");
  CHECK(r && r->type == REDIS_REPLY_ARRAY && r->elements == 3 && r->element[1]->type == REDIS_REPLY_NIL &&
            strcmp(r->element[2]->str, "2") == 0,
        "MGET");
  freeReplyObject(r);
  redisFree(c);
  if (failures) return 1;
  printf("hiredis: ok\n");
  return 0;
}
