"""ToolBench tool JSON and StableToolBench query files, on hand-written files."""

import json
import os

import pytest

from toolenv.catalog import toolbench

DATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "toolbench")


@pytest.fixture(scope="module")
def tools():
  return {t.name: t for t in toolbench.load_tools(os.path.join(DATA, "tools"))}


def test_names_categories_and_order(tools):
  # Files sorted by path: Finance/coinbase.json before Weather/weather_api.json.
  assert list(tools) == ["rate_for_coin_rates", "current_weather_for_weather_api",
                         "station_by_id_for_weather_api",
                         "report_outage_for_weather_api"]
  assert tools["rate_for_coin_rates"].category == "finance"
  assert tools["current_weather_for_weather_api"].provider == "weather_api"


def test_parameters_types_defaults_required(tools):
  cw = tools["current_weather_for_weather_api"]
  assert cw.required == ["city"]
  assert cw.properties == {
      "city": {"type": "string", "description": "City name", "default": "Paris"},
      "units": {"type": "string", "description": "metric or imperial"},
      "days": {"type": "number", "description": "Forecast days", "default": "3"}}
  assert cw.effect == "read" and cw.source == "toolbench"
  assert cw.meta["api_name"] == "Current weather"
  report = tools["report_outage_for_weather_api"]
  assert report.effect == "write" and report.properties["is_urgent"]["type"] == "boolean"
  # "optional_parameters": null is read as no parameters.
  assert tools["rate_for_coin_rates"].required == ["symbol"]


def test_empty_description_falls_back_and_id_param_consumes(tools):
  st = tools["station_by_id_for_weather_api"]
  assert st.description.startswith("Station by id (Weather API).")
  assert st.meta["consumes"] == {"stationId": "weather_api/station_id"}


def test_queries_map_to_tool_names(tools):
  qs = toolbench.load_queries(os.path.join(DATA, "G1_instruction.json"))
  assert [q.query_id for q in qs] == [8812, 8813]
  q = qs[0]
  assert q.instruction.startswith("What's the weather in Oslo")
  assert q.relevant == ["current_weather_for_weather_api", "rate_for_coin_rates"]
  assert q.categories == ["weather", "finance"]
  assert all(n in tools for q in qs for n in q.apis + q.relevant)


def test_bad_files_give_clear_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="StableToolBench"):
    toolbench.load_tools(str(tmp_path / "nope"))
  (tmp_path / "X").mkdir()
  (tmp_path / "X" / "bad.json").write_text(json.dumps({"tool_name": "x"}))
  with pytest.raises(ValueError, match="bad.json.*api_list"):
    toolbench.load_tools(str(tmp_path))
  (tmp_path / "q.json").write_text(json.dumps([{"query_id": 1}]))
  with pytest.raises(ValueError, match="without 'query'"):
    toolbench.load_queries(str(tmp_path / "q.json"))


def test_response_schemas_from_schema_example_or_default(tools):
  # test_endpoint {"temp": 12} -> an integer field; nothing documented -> the default.
  assert tools["current_weather_for_weather_api"].response == {
      "type": "object", "properties": {"temp": {"type": "integer"}}, "required": ["temp"]}
  assert tools["station_by_id_for_weather_api"].response == toolbench.DEFAULT_RESPONSE
  api = {"schema": {"type": "object", "properties": {"aqi": {"type": "integer"}}},
         "test_endpoint": {"x": "y"}}
  assert toolbench.response_schema(api)["properties"] == {"aqi": {"type": "integer"}}
  nested = toolbench.response_schema({"test_endpoint": {"hotels": [{"id": "h1", "p": 1.5}]}})
  assert nested["properties"]["hotels"] == {
      "type": "array", "items": {"type": "object", "properties": {
          "id": {"type": "string"}, "p": {"type": "number"}}, "required": ["id", "p"]}}
  # An error string as the example (common in ToolBench) is not a schema.
  assert toolbench.response_schema({"test_endpoint": "not subscribed"}) == toolbench.DEFAULT_RESPONSE
