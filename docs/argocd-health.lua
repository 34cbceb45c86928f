-- Argo CD health check for VerlJob (verl-operator.io/v1alpha1).
-- Register it as resource.customizations.health.verl-operator.io_VerlJob in argocd-cm (see docs/gitops.md).
-- Argo CD runs it with the object in the global `obj`; it reads only `status`, written by the operator:
--   Running, Succeeded            -> Healthy
--   Pending, Starting, no status  -> Progressing (also while status.observedGeneration < metadata.generation)
--   Invalid, Failed               -> Degraded
--   Suspended                     -> Suspended
-- Without a phase it falls back to the kstatus conditions (Stalled, Ready, Reconciling).
-- Lua 5.1 with only the base, string and table libraries, as in Argo CD.

local hs = {}

local function condition(status, kind)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

-- The first argument that is a non-empty string.
local function first(a, b, c)
  local candidates = {a, b, c}
  for i = 1, 3 do
    local v = candidates[i]
    if type(v) == "string" and v ~= "" then
      return v
    end
  end
  return nil
end

local status = obj.status
if status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to reconcile the job"
  return hs
end

local generation = obj.metadata ~= nil and obj.metadata.generation or nil
if generation ~= nil and status.observedGeneration ~= nil and status.observedGeneration < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation)
  return hs
end

local phase = status.phase
local byPhase = {
  Running = "Healthy",
  Succeeded = "Healthy",
  Pending = "Progressing",
  Starting = "Progressing",
  Invalid = "Degraded",
  Failed = "Degraded",
  Suspended = "Suspended",
}

if phase ~= nil and byPhase[phase] ~= nil then
  hs.status = byPhase[phase]
  local reason = status.reason
  local text = first(status.message, phase)
  if reason ~= nil and reason ~= "" and reason ~= phase then
    text = phase .. " (" .. reason .. "): " .. text
  elseif text ~= phase then
    text = phase .. ": " .. text
  end
  hs.message = text
  return hs
end

-- No phase this script knows: read the kstatus conditions the operator also writes.
local stalled = condition(status, "Stalled")
local ready = condition(status, "Ready")
local reconciling = condition(status, "Reconciling")
if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = first(stalled.message, stalled.reason, "Stalled")
elseif ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = first(ready.message, ready.reason, "Ready")
elseif reconciling ~= nil and reconciling.status == "True" then
  hs.status = "Progressing"
  hs.message = first(reconciling.message, reconciling.reason, "Reconciling")
elseif phase == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to set a phase"
else
  hs.status = "Unknown"
  hs.message = "Unknown phase " .. tostring(phase)
end
return hs
