// The script commands as the table names them: EVAL, EVALSHA, EVAL_RO,
// EVALSHA_RO and SCRIPT, all run by the executor's scripting (script.hpp).
#include "command_context.hpp"
#include "script.hpp"

namespace conveyor::kv {

void cmd_eval(exec_context& c) {
  c.ex.scripts().eval(c, false, false);
}
void cmd_evalsha(exec_context& c) {
  c.ex.scripts().eval(c, true, false);
}
void cmd_eval_ro(exec_context& c) {
  c.ex.scripts().eval(c, false, true);
}
void cmd_evalsha_ro(exec_context& c) {
  c.ex.scripts().eval(c, true, true);
}
void cmd_script(exec_context& c) {
  c.ex.scripts().script(c);
}

}  // namespace conveyor::kv
