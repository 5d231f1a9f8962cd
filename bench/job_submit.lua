-- bench/submit.py's job_submit/lua baseline: the rewrite tether does for the tres+gres row of the
-- Slurm table in docs/requirements.md (--slots/--slots-per-node from spank_job_env -> --gpus,
-- --nodes, --tasks-per-node, --gpus-per-task, the task count, no requeue), written the way a site
-- would in Lua.
function slurm_job_submit(job_desc, part_list, submit_uid)
   local env = job_desc.spank_job_env
   if env == nil then
      return slurm.SUCCESS
   end
   local slots, spn
   for _, entry in pairs(env) do
      local key, value = string.match(entry, "^([^=]+)=(.*)$")
      if key == "TETHER_SLOTS" then
         slots = tonumber(value)
      elseif key == "TETHER_SLOTS_PER_NODE" then
         spn = tonumber(value)
      end
   end
   if slots == nil then
      return slurm.SUCCESS
   end
   if job_desc.min_nodes ~= slurm.NO_VAL or job_desc.num_tasks ~= slurm.NO_VAL then
      slurm.log_user("tether: --nodes/--ntasks conflict with --slots")
      return slurm.ERROR
   end
   job_desc.tres_per_job = "gres:gpu:" .. slots
   job_desc.min_nodes = 1
   job_desc.max_nodes = slots
   if spn ~= nil then
      if slots % spn ~= 0 then
         slurm.log_user("tether: --slots-per-node=" .. spn .. " does not divide --slots=" .. slots)
         return slurm.ERROR
      end
      job_desc.ntasks_per_node = 1
      job_desc.tres_per_task = "gres:gpu:" .. spn
      job_desc.num_tasks = math.floor(slots / spn)
   end
   job_desc.requeue = 0
   return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   return slurm.SUCCESS
end
